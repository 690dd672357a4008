#!/bin/busybox sh
# /init of the `cargo xtask vm-test` guest (packed by xtask/src/guest_init.rs).
#
# The kernel hands command-line words without a dot to /init as environment
# variables: VMTEST_RUN (plain, virtio, vfio or weak: the vfio run's
# devices, a CPU without AES-NI) and CRYPTO_OFFLOAD_GUEST=1.
# Everything the host judges is a line starting with VMTEST- on the serial
# console:
#   VMTEST-INIT, VMTEST-BOOTED           /init started; modules loaded
#   VMTEST-BEGIN <name>                  a test binary or step starts
#   VMTEST-END <name> rc=<exit status>   ... and ends
#   VMTEST-VIRTIO-CRYPTO <device|none>   the virtio run's device, bound or not
#   VMTEST-VFIO <bdf> group=<n>          vfio run: a device bound to vfio-pci
#   VMTEST-VFIO <bdf> failed <why>       ... one that could not be bound
#   VMTEST-VFIO none                     ... no virtio-crypto device found
#   VMTEST-VIRTIO-CRYPTO <virtioN> <bdf> vfio run: a device without
#                                        ACCESS_PLATFORM, bound to virtio_crypto
#   VMTEST-VIRTIO-CRYPTO none <bdf> <why> ... one that is not
#   VMTEST-NOTE <text>                   for people; never judged
#   VMTEST-DONE                          all ran; the guest powers off
# and one line the host acts on (in runs with a QMP socket, the vfio run):
#   VMTEST-QMP <command> [<JSON object>] the host sends that QMP command to
#                                        QEMU and logs the reply; nothing comes
#                                        back to the guest, which watches sysfs
# In the vfio run the tests see VMTEST_VFIO_DEVICES: the PCI addresses of
# the devices bound to vfio-pci (e.g. "0000:01:00.0 0000:02:00.0"), and
# VMTEST_VIRTIO_DEVICES: those left to virtio_crypto (e.g. "0000:03:00.0"),
# each blank-separated.
# Files: /etc/vmtest/modules (insmod order, every run), then
# /etc/vmtest/modules-$VMTEST_RUN if present (the run's own modules),
# /etc/vmtest/tests ("<runs> <name>": which runs run /tests/<name>),
# /etc/vmtest/test-args (extra libtest arguments, one a line),
# /etc/vmtest/steps (commands after the tests).

/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox mount -t tmpfs tmpfs /tmp
/bin/busybox --install -s
export PATH=/sbin:/usr/sbin:/bin:/usr/bin HOME=/tmp TMPDIR=/tmp RUST_BACKTRACE=1
export VMTEST_RUN CRYPTO_OFFLOAD_GUEST
# The fuzz target (/bin/fuzz-cipher, AddressSanitizer) as fuzz/smoke runs
# cipher: no leak check, neither per input nor at exit (threads of the
# harness's runtime outlive their input: fuzz/README.md, "Leaks"), and
# cargo-fuzz's detect_odr_violation=0. Nothing else here is built with ASan.
export ASAN_OPTIONS=detect_leaks=0:detect_odr_violation=0

uptime_s() { cut -d' ' -f1 /proc/uptime; }
echo "VMTEST-INIT run=$VMTEST_RUN kernel=$(uname -r) uptime=$(uptime_s)"

# True if this run is among $1: "all" or a comma-separated list of runs.
for_this_run() {
    case ",$1," in ",all," | *",$VMTEST_RUN,"*) return 0 ;; esac
    return 1
}

# Modules, dependencies first: every run's, then this run's own. A failure
# (already loaded, built in, refused) is logged and the boot goes on: the
# tests say what is missing.
for list in /etc/vmtest/modules "/etc/vmtest/modules-$VMTEST_RUN"; do
    [ -f "$list" ] || continue
    while read -r module; do
        [ -n "$module" ] || continue
        if ! out=$(insmod "$module" 2>&1); then
            echo "VMTEST-NOTE insmod ${module##*/} failed: $out"
        fi
    done < "$list"
done
echo "VMTEST-BOOTED run=$VMTEST_RUN modules=$(wc -l < /proc/modules) uptime=$(uptime_s)"
# What the guest CPU offers of what crypto code looks for (the weak run's
# has none of aes, pclmulqdq, vaes, vpclmulqdq: its weak-cpu step checks).
echo "VMTEST-NOTE cpu: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2-) flags:$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -x -e aes -e pclmulqdq -e vaes -e vpclmulqdq -e avx2 -e avx512f -e ssse3 -e sse4_2 | tr '\n' ' ')"

if [ "$VMTEST_RUN" = virtio ]; then
    # The driver binds during insmod; allow a moment for the device to start.
    bound=
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        bound=$(ls /sys/bus/virtio/drivers/virtio_crypto 2>/dev/null | grep '^virtio' | head -n 1)
        [ -n "$bound" ] && break
        sleep 0.2
    done
    echo "VMTEST-VIRTIO-CRYPTO ${bound:-none}"
fi

# The name a sysfs link points to ("" if there is no link).
link_name() {
    target=$(readlink "$1") || return 0
    echo "${target##*/}"
}

# The virtio device (/sys/.../virtioN) that virtio-pci made of the PCI
# device $1 (a sysfs folder), if any.
virtio_of() {
    for v in "$1"/virtio*; do
        [ -d "$v" ] && echo "$v" && return 0
    done
    return 0
}

# The PCI devices 1af4:1054 (virtio-crypto), as sysfs folders.
virtio_crypto_pci() {
    for dev in /sys/bus/pci/devices/*; do
        [ "$(cat "$dev/vendor")" = 0x1af4 ] && [ "$(cat "$dev/device")" = 0x1054 ] && echo "$dev"
    done
    return 0
}

if [ "$VMTEST_RUN" = vfio ] || [ "$VMTEST_RUN" = weak ]; then
    # (The weak run has the vfio run's devices.) Hand every virtio-crypto device (1af4:1054) that offers
    # VIRTIO_F_ACCESS_PLATFORM (QEMU's iommu_platform=on: its DMA goes
    # through the IOMMU) to vfio-pci for the userspace driver: off its driver
    # (virtio-pci took it at insmod), then driver_override so that only
    # vfio-pci probes it. A device without it DMAs to guest-physical
    # addresses, which the VFIO driver cannot give it: it stays with the
    # kernel's virtio_crypto (AF_ALG) and is listed in VMTEST_VIRTIO_DEVICES.
    #
    # The features are virtio_crypto's, negotiated at its probe: wait for it
    # to drive every device first (it binds during insmod; allow a moment).
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        unbound=
        for dev in $(virtio_crypto_pci); do
            v=$(virtio_of "$dev")
            [ "$(link_name "$v/driver")" = virtio_crypto ] || unbound=1
        done
        [ -z "$unbound" ] && break
        sleep 0.2
    done
    VMTEST_VFIO_DEVICES=
    VMTEST_VIRTIO_DEVICES=
    found=
    for dev in $(virtio_crypto_pci); do
        bdf=${dev##*/}
        found=1
        # The virtio device's features: one '0'/'1' per bit, bit 0 first, so
        # VIRTIO_F_ACCESS_PLATFORM (bit 33) is the 34th character.
        v=$(virtio_of "$dev")
        features=
        [ -n "$v" ] && features=$(cat "$v/features")
        echo "VMTEST-NOTE vfio: $bdf ${v##*/} features=${features:-unknown}"
        if [ "$(echo "$features" | cut -c34)" != 1 ]; then
            driver=$(link_name "$v/driver")
            if [ "$driver" = virtio_crypto ]; then
                echo "VMTEST-VIRTIO-CRYPTO ${v##*/} $bdf"
                echo "VMTEST-NOTE vfio: $bdf (${v##*/}) offers no VIRTIO_F_ACCESS_PLATFORM: left to virtio_crypto (AF_ALG)"
                VMTEST_VIRTIO_DEVICES="${VMTEST_VIRTIO_DEVICES:+$VMTEST_VIRTIO_DEVICES }$bdf"
            else
                echo "VMTEST-VIRTIO-CRYPTO none $bdf driver=${driver:-none}"
            fi
            continue
        fi
        if [ -e "$dev/driver" ]; then
            echo "$bdf" > "$dev/driver/unbind"
        fi
        echo vfio-pci > "$dev/driver_override"
        echo "$bdf" > /sys/bus/pci/drivers_probe
        driver=$(link_name "$dev/driver")
        group=$(link_name "$dev/iommu_group")
        if [ "$driver" = vfio-pci ] && [ -n "$group" ] && [ -c "/dev/vfio/$group" ]; then
            echo "VMTEST-VFIO $bdf group=$group"
            VMTEST_VFIO_DEVICES="${VMTEST_VFIO_DEVICES:+$VMTEST_VFIO_DEVICES }$bdf"
        else
            echo "VMTEST-VFIO $bdf failed driver=${driver:-none} group=${group:-none}"
        fi
    done
    [ -n "$found" ] || echo "VMTEST-VFIO none"
    export VMTEST_VFIO_DEVICES VMTEST_VIRTIO_DEVICES
    echo "VMTEST-NOTE vfio: /dev/vfio: $(ls /dev/vfio 2>/dev/null | tr '\n' ' ')"
fi

# The drivers behind the algorithms the project uses, as /proc/crypto lists them.
awk '/^name/ { name = $3 } /^driver/ { driver = $3 } /^module/ { module = $3 }
     /^priority/ { prio = $3 }
     /^type/ && name ~ /^((ecb|cbc|ctr|xts|gcm)\(aes\)|crc32c?|crc64-rocksoft)$/ {
         printf "VMTEST-NOTE crypto %-16s %-28s prio=%-4s module=%s type=%s\n", name, driver, prio, module, $3 }' /proc/crypto

# Runs "$@" as one judged unit called $1, in a fresh writable folder. Its
# output goes through a pipe, as in CI: no terminal, so no progress bars;
# pipefail keeps its exit status.
set -o pipefail
run_framed() {
    name=$1
    shift
    mkdir -p "/tmp/work/$name"
    echo "VMTEST-BEGIN $name"
    (cd "/tmp/work/$name" && exec "$@" </dev/null) 2>&1 | cat
    echo "VMTEST-END $name rc=$?"
}

# Extra libtest arguments, one a line (so a --skip pattern may hold spaces).
set --
while IFS= read -r arg; do
    [ -n "$arg" ] && set -- "$@" "$arg"
done < /etc/vmtest/test-args

# Tests: "<runs> <name>" runs /tests/<name> in those runs.
while read -r runs name; do
    case "$runs" in '' | '#'*) continue ;; esac
    for_this_run "$runs" || continue
    # Right after boot an exec of a test binary can fail with ETXTBSY ("Text
    # file busy"): seen in the vfio run with a 300 MiB initramfs, for more
    # than 10 s, always /tests/vfio (not the last file in the archive: one
    # put after it did not help; the cause is not known). Wait a little,
    # then run a copy (a file this shell wrote and closed) instead.
    binary="/tests/$name"
    tries=0
    until "$binary" --list >/dev/null 2>&1 || [ "$tries" -ge 20 ]; do
        tries=$((tries + 1))
        sleep 0.1
    done
    if [ "$tries" -ge 20 ]; then
        mkdir -p /tmp/exec
        cp "$binary" "/tmp/exec/$name" && binary="/tmp/exec/$name"
        echo "VMTEST-NOTE $name not executable after 2 s (ETXTBSY?): running a copy"
    elif [ "$tries" -gt 0 ]; then
        echo "VMTEST-NOTE $name became executable after $tries tries"
    fi
    run_framed "$name" "$binary" --test-threads=2 "$@"
done < /etc/vmtest/tests

# Steps: "<runs> <name> <program> [args...]"; runs is "all" or a comma list.
while read -r runs name program args; do
    case "$runs" in '' | '#'*) continue ;; esac
    for_this_run "$runs" || continue
    if [ ! -x "$program" ]; then
        echo "VMTEST-NOTE step $name skipped: $program is not in the initramfs"
        continue
    fi
    # $args is split on blanks on purpose: steps hold no quoted arguments.
    # shellcheck disable=SC2086
    run_framed "$name" "$program" $args
done < /etc/vmtest/steps

echo "VMTEST-DONE run=$VMTEST_RUN uptime=$(uptime_s)"
poweroff -f
