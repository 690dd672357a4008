//! Reading `crypto-offload/vectors/*.txt` (format in that folder's README):
//! `#` comment lines, records separated by blank lines, `field = value`
//! lines with lowercase hex values. Only the seed generator and the tests
//! read them; the targets never touch files.

use std::collections::BTreeMap;
use std::path::Path;

/// One record: its fields by name.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The file it came from (for messages).
    pub file: String,
    /// Field name → value as written.
    pub fields: BTreeMap<String, String>,
}

impl Record {
    /// A text field.
    pub fn text(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// A hex field, decoded.
    ///
    /// # Panics
    /// On a field that is missing or not hex: the vector files are checked
    /// in, so that is a broken file.
    pub fn hex(&self, name: &str) -> Vec<u8> {
        let v = self
            .text(name)
            .unwrap_or_else(|| panic!("{}: a record without `{name}`", self.file));
        assert!(
            v.len().is_multiple_of(2),
            "{}: odd hex in `{name}`",
            self.file
        );
        (0..v.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(&v[i..i + 2], 16)
                    .unwrap_or_else(|_| panic!("{}: bad hex in `{name}`", self.file))
            })
            .collect()
    }

    /// The algorithm name (`alg`).
    pub fn alg(&self) -> &str {
        self.text("alg").unwrap_or("")
    }
}

/// Parses one file's text.
pub fn parse(file: &str, text: &str) -> Vec<Record> {
    let mut out = Vec::new();
    let mut cur = Record {
        file: file.to_owned(),
        ..Record::default()
    };
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if !cur.fields.is_empty() {
                out.push(std::mem::replace(
                    &mut cur,
                    Record {
                        file: file.to_owned(),
                        ..Record::default()
                    },
                ));
            }
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            cur.fields.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    if !cur.fields.is_empty() {
        out.push(cur);
    }
    out
}

/// Every record of every `*.txt` in `dir`, files in name order.
///
/// # Errors
/// Reading the folder or a file.
pub fn load(dir: &Path) -> std::io::Result<Vec<Record>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "txt"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f)?;
        out.extend(parse(&f.display().to_string(), &text));
    }
    Ok(out)
}

/// The vectors folder of this checkout (`../crypto-offload/vectors`).
pub fn default_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crypto-offload/vectors")
}
