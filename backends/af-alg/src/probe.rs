//! Whether AF_ALG works here at all, and why not.

use crate::error::Error;
use crate::socket::Transform;

/// The sysctl with which a kernel restricts AF_ALG (7.3 and later): 0 open,
/// 1 an allowlist (binding anything else fails with `ENOENT`), 2 off
/// (`EAFNOSUPPORT`).
pub const RESTRICT_SYSCTL: &str = "/proc/sys/crypto/af_alg_restrict";

/// The `af_alg_restrict` level, if the kernel has the sysctl.
pub fn restrict_level() -> Option<u8> {
    std::fs::read_to_string(RESTRICT_SYSCTL)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// Checks that an AF_ALG socket can be bound, with an algorithm every kernel
/// with AF_ALG has (`cbc(aes)`).
///
/// # Errors
/// [`Error::Unavailable`] saying why: no AF_ALG in this kernel
/// (`EAFNOSUPPORT`, or `af_alg_restrict = 2`), the allowlist
/// (`af_alg_restrict = 1`), or no permission.
pub fn probe() -> Result<(), Error> {
    Transform::bind("skcipher", "cbc(aes)", false).map(drop)
}

/// A one-line reason for `probe`'s failure, naming the sysctl when it is
/// what restricts AF_ALG.
pub fn unavailable_reason(error: &Error) -> String {
    reason(restrict_level(), error)
}

fn reason(restrict: Option<u8>, error: &Error) -> String {
    match (restrict, error.raw_os_error()) {
        (Some(2), _) => format!("{RESTRICT_SYSCTL} = 2 (AF_ALG off): {error}"),
        (Some(1), _) => format!("{RESTRICT_SYSCTL} = 1 (allowlist only): {error}"),
        (_, Some(e)) if e == nix::errno::Errno::EAFNOSUPPORT as i32 => {
            "this kernel has no AF_ALG (EAFNOSUPPORT)".to_owned()
        }
        _ => error.to_string(),
    }
}

/// The most data one AF_ALG operation carries here: the operation socket's
/// send and receive buffers, which this binding asks to be 1 MiB and the
/// kernel caps at twice `net.core.wmem_max` / `rmem_max`, in whole pages
/// (see the socket module). CBC, CTR and ECB requests beyond it are split;
/// an XTS unit or a GCM message (with its associated data and tag) beyond
/// it is [`Error::TooLarge`]. An engine's own limit (the engine table) may
/// be lower.
pub fn operation_limit() -> usize {
    let sysctl = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/core/{name}"))
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(212_992)
    };
    let granted = |max: usize| 2 * max.min(crate::socket::SOCKET_BUFFER);
    crate::socket::operation_limit(
        granted(sysctl("wmem_max")),
        granted(sysctl("rmem_max")),
        crate::socket::page_size(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::errno::Errno;

    #[test]
    fn reasons_name_the_restriction_or_the_missing_family() {
        let off = Error::sys("socket", "sockets", Errno::EAFNOSUPPORT);
        assert!(reason(None, &off).contains("no AF_ALG"));
        assert!(reason(Some(2), &off).contains("af_alg_restrict = 2"));
        let listed = Error::sys("bind", "cbc(aes)", Errno::ENOENT);
        assert!(reason(Some(1), &listed).contains("allowlist"));
        assert!(reason(None, &listed).contains("cbc(aes)"));
    }
}
