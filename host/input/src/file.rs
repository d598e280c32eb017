//! Bounded file reads: only regular files, at most a fixed size, as UTF-8.

use std::{
    io::Read,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

use crate::yaml::{self, YamlError};

/// The most bytes any config, fixture or policy file may hold: 1 MiB. The API server refuses
/// objects over ~1.5 MiB, and kiln's own files are a few KiB.
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// Why an input file could not be used. `Display` starts with the file and includes the
/// cause (there is no further `source()`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be opened or read (missing, no permission, not UTF-8).
    #[error("{}: cannot read: {error}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// The IO error (part of the message, so not also a `source()`).
        error: std::io::Error,
    },
    /// A directory, device, FIFO or socket where a regular file is needed.
    #[error("{}: not a regular file ({kind})", file.display())]
    NotAFile {
        /// The file.
        file: PathBuf,
        /// What it is instead: `directory`, `character device`, ….
        kind: &'static str,
    },
    /// Larger than the limit.
    #[error("{}: larger than {limit} bytes", file.display())]
    TooLarge {
        /// The file.
        file: PathBuf,
        /// The limit, bytes.
        limit: u64,
    },
    /// The content is not an acceptable YAML/JSON document.
    #[error("{}: {error}", file.display())]
    Yaml {
        /// The file.
        file: PathBuf,
        /// What is wrong and at which field (part of the message).
        error: YamlError,
    },
}

impl InputError {
    /// The file this error is about.
    #[must_use]
    pub fn file(&self) -> &Path {
        match self {
            Self::Read { file, .. }
            | Self::NotAFile { file, .. }
            | Self::TooLarge { file, .. }
            | Self::Yaml { file, .. } => file,
        }
    }
}

/// What a file type is, in words for messages: `directory`, `character device`, `block
/// device`, `FIFO`, `socket`, `symlink` (for `symlink_metadata`), `regular file`.
#[must_use]
pub fn file_kind(ft: &std::fs::FileType) -> &'static str {
    kind_of(*ft)
}

fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_file() {
        "regular file"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_dir() {
        "directory"
    } else if ft.is_char_device() {
        "character device"
    } else if ft.is_block_device() {
        "block device"
    } else if ft.is_fifo() {
        "FIFO"
    } else if ft.is_socket() {
        "socket"
    } else {
        "not a file"
    }
}

/// Reads `path` as UTF-8 text when it is a regular file (symlinks followed) of at most `limit`
/// bytes. The type is checked on the opened file, and at most `limit + 1` bytes are read, so a
/// file that grows meanwhile is still refused.
///
/// # Errors
/// [`InputError::Read`] (missing, unreadable, not UTF-8), [`InputError::NotAFile`],
/// [`InputError::TooLarge`].
pub fn read_bounded(path: &Path, limit: u64) -> Result<String, InputError> {
    let read_err = |error| InputError::Read {
        file: path.to_owned(),
        error,
    };
    // Opening a FIFO for reading blocks until a writer appears; check the type first, then
    // again on the opened file (the path may have been swapped in between).
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if !meta.is_file() {
        return Err(InputError::NotAFile {
            file: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    let f = std::fs::File::open(path).map_err(read_err)?;
    let meta = f.metadata().map_err(read_err)?;
    if !meta.is_file() {
        return Err(InputError::NotAFile {
            file: path.to_owned(),
            kind: kind_of(meta.file_type()),
        });
    }
    if meta.len() > limit {
        return Err(InputError::TooLarge {
            file: path.to_owned(),
            limit,
        });
    }
    let mut buf = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    f.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    if buf.len() as u64 > limit {
        return Err(InputError::TooLarge {
            file: path.to_owned(),
            limit,
        });
    }
    String::from_utf8(buf).map_err(|e| {
        read_err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })
}

/// Reads `path` with [`read_bounded`] (limit [`MAX_FILE_BYTES`]) and decodes it with
/// [`yaml::from_str`]. An empty file is the document `null`.
///
/// # Errors
/// As [`read_bounded`], or [`InputError::Yaml`] naming the field.
pub fn load_file<T: DeserializeOwned>(path: &Path) -> Result<T, InputError> {
    let text = read_bounded(path, MAX_FILE_BYTES)?;
    yaml::from_str(&text).map_err(|error| InputError::Yaml {
        file: path.to_owned(),
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_devices_directories_and_large_files_are_refused() {
        let e = read_bounded(Path::new("/nonexistent/kiln.yaml"), 10).unwrap_err();
        assert!(matches!(e, InputError::Read { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("/nonexistent/kiln.yaml: cannot read: "),
            "{e}"
        );
        let e = read_bounded(Path::new("/dev/urandom"), MAX_FILE_BYTES).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/urandom: not a regular file (character device)"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = read_bounded(dir.path(), 10).unwrap_err();
        assert!(
            e.to_string().ends_with("not a regular file (directory)"),
            "{e}"
        );
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, "a".repeat(11)).unwrap();
        let e = read_bounded(&big, 10).unwrap_err();
        assert!(matches!(e, InputError::TooLarge { limit: 10, .. }), "{e:?}");
        assert_eq!(read_bounded(&big, 11).unwrap(), "a".repeat(11));
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        let e = read_bounded(&big, 10).unwrap_err();
        assert!(e.to_string().contains("not UTF-8"), "{e}");
    }

    #[test]
    fn load_file_names_the_file_and_the_field() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Doc {
            count: u32,
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("doc.yaml");
        std::fs::write(&p, "count: -1\n").unwrap();
        let e = load_file::<Doc>(&p).unwrap_err();
        assert_eq!(e.file(), p);
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "{}: count: invalid value: integer `-1`",
                p.display()
            )),
            "{text}"
        );
    }
}
