//! Discovery: the kernel's algorithm table, `/proc/crypto`.

use std::collections::BTreeMap;

/// One implementation the kernel has registered.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Registered {
    /// The generic name, e.g. `"cbc(aes)"`.
    pub name: String,
    /// The implementation's own name, e.g. `"cbc-aes-aesni"`.
    pub driver: String,
    /// The module it came from (`"kernel"` when built in).
    pub module: String,
    /// Higher wins when binding by generic name.
    pub priority: i32,
    /// `"skcipher"`, `"aead"`, `"shash"`, `"ahash"`, `"cipher"`, …
    pub kind: String,
    /// Whether requests complete asynchronously (an engine with a queue).
    pub is_async: bool,
    /// Whether the kernel's self-test passed (`"passed"`; `"unknown"` when
    /// the kernel was built without self-tests).
    pub selftest_passed: bool,
    /// An internal helper AF_ALG cannot bind.
    pub internal: bool,
    /// Every other field, as printed.
    pub other: BTreeMap<String, String>,
}

impl Registered {
    /// Whether AF_ALG can bind it as one of `skcipher`, `aead` or `hash`.
    pub fn af_alg_type(&self) -> Option<&'static str> {
        if self.internal {
            return None;
        }
        match self.kind.as_str() {
            "skcipher" => Some("skcipher"),
            "aead" => Some("aead"),
            "shash" | "ahash" => Some("hash"),
            _ => None,
        }
    }
}

/// Parses the text of `/proc/crypto`: blank-line separated records of
/// `key : value` lines. Records without a name or driver are skipped.
pub fn parse(text: &str) -> Vec<Registered> {
    let mut out = Vec::new();
    let mut fields: BTreeMap<String, String> = BTreeMap::new();
    let mut flush = |fields: &mut BTreeMap<String, String>| {
        if let (Some(name), Some(driver)) = (fields.remove("name"), fields.remove("driver")) {
            let yes = |v: Option<String>| v.is_some_and(|v| v == "yes");
            out.push(Registered {
                name,
                driver,
                module: fields.remove("module").unwrap_or_default(),
                priority: fields
                    .remove("priority")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0),
                kind: fields.remove("type").unwrap_or_default(),
                is_async: yes(fields.remove("async")),
                selftest_passed: fields
                    .remove("selftest")
                    .is_some_and(|s| s == "passed" || s == "unknown"),
                internal: yes(fields.remove("internal")),
                other: std::mem::take(fields),
            });
        }
        fields.clear();
    };
    for line in text.lines() {
        match line.split_once(':') {
            Some((k, v)) if !line.trim().is_empty() => {
                fields.insert(k.trim().to_owned(), v.trim().to_owned());
            }
            _ => flush(&mut fields),
        }
    }
    flush(&mut fields);
    out
}

/// Reads and parses `/proc/crypto`.
///
/// # Errors
/// The file cannot be read (no procfs, or a kernel without the crypto API).
pub fn read() -> std::io::Result<Vec<Registered>> {
    Ok(parse(&std::fs::read_to_string("/proc/crypto")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
name         : cbc(aes)
driver       : virtio_crypto_aes_cbc
module       : virtio_crypto
priority     : 150
refcnt       : 1
selftest     : passed
internal     : no
type         : skcipher
async        : yes
blocksize    : 16
min keysize  : 16
max keysize  : 32
ivsize       : 16

name         : __xts(aes)
driver       : __xts-aes-aesni
module       : aesni_intel
priority     : 401
refcnt       : 1
selftest     : passed
internal     : yes
type         : skcipher
async        : no

name         : crc32c
driver       : crc32c-intel
module       : crc32c_intel
priority     : 200
refcnt       : 2
selftest     : passed
internal     : no
type         : shash
blocksize    : 1
digestsize   : 4
";

    #[test]
    fn parses_records_and_flags() {
        let r = parse(SAMPLE);
        assert_eq!(r.len(), 3);
        assert_eq!(r[0].driver, "virtio_crypto_aes_cbc");
        assert_eq!(r[0].priority, 150);
        assert!(r[0].is_async && r[0].selftest_passed && !r[0].internal);
        assert_eq!(r[0].af_alg_type(), Some("skcipher"));
        assert_eq!(r[0].other.get("ivsize").map(String::as_str), Some("16"));
        assert!(r[1].internal);
        assert_eq!(r[1].af_alg_type(), None);
        assert_eq!(r[2].af_alg_type(), Some("hash"));
        assert!(!r[2].is_async);
    }

    #[test]
    fn garbage_parses_to_nothing_without_panicking() {
        assert!(parse("").is_empty());
        assert!(parse(":\n::\nname\n\n\u{0}: x").is_empty());
        assert_eq!(parse("name: a\ndriver: b\npriority: x").len(), 1);
    }
}
