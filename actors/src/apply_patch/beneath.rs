//! File operations that stay under a workspace root however the tree changes meanwhile.
//!
//! [`super::resolve_in_workspace`] checks a path once; a command running at the same time
//! (in the background, say) could then swap a directory on the way for a symlink to somewhere
//! else before the write. Here every open resolves the path relative to the root's directory
//! with `openat2(RESOLVE_BENEATH)`: the kernel refuses, atomically, any resolution (`..`, an
//! absolute symlink, a symlink leading out) that leaves the root. Directories are made with
//! `mkdirat` in the directory already opened, so nothing is created elsewhere either.

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// A path under one of the roots: the root, and the path below it (normal components only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beneath {
    pub root: PathBuf,
    pub rel: PathBuf,
}

impl Beneath {
    /// `lexical` (absolute, `.` and `..` already removed) below the first root it is in.
    pub fn of(roots: &[PathBuf], lexical: &Path) -> Option<Self> {
        // A root as configured, or as its real path (the patch may name either).
        let spellings = roots.iter().flat_map(|root| {
            std::iter::once((root, root.clone())).chain(
                std::fs::canonicalize(root)
                    .ok()
                    .filter(|real| real != root)
                    .map(|real| (root, real)),
            )
        });
        spellings.into_iter().find_map(|(root, spelled)| {
            let rel = lexical.strip_prefix(&spelled).ok()?;
            let normal = rel.components().all(|c| matches!(c, Component::Normal(_)));
            (normal && rel.components().next().is_some()).then(|| Self {
                root: root.clone(),
                rel: rel.to_path_buf(),
            })
        })
    }

    fn root_fd(&self) -> std::io::Result<OwnedFd> {
        // The root itself is the configuration's: followed as it is.
        Ok(rustix::fs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?)
    }

    /// The directory holding the file, opened beneath the root; `create`: made as needed.
    fn parent_fd(&self, root: &OwnedFd, create: bool) -> std::io::Result<OwnedFd> {
        let parents: Vec<&std::ffi::OsStr> = self
            .rel
            .parent()
            .into_iter()
            .flat_map(Path::components)
            .map(Component::as_os_str)
            .collect();
        let dir = |prefix: &[&std::ffi::OsStr]| -> std::io::Result<OwnedFd> {
            if prefix.is_empty() {
                return Ok(rustix::io::dup(root)?);
            }
            let path: PathBuf = prefix.iter().collect();
            Ok(open_beneath(
                root,
                &path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?)
        };
        if !create {
            return dir(&parents);
        }
        for n in 1..=parents.len() {
            match dir(&parents[..n]) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let holder = dir(&parents[..n - 1])?;
                    match rustix::fs::mkdirat(&holder, parents[n - 1], Mode::from(0o777)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        dir(&parents)
    }

    fn name(&self) -> &std::ffi::OsStr {
        self.rel.file_name().unwrap_or_default()
    }

    /// The file's text.
    pub fn read(&self) -> std::io::Result<String> {
        let root = self.root_fd()?;
        let fd = open_beneath(
            &root,
            &self.rel,
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut text = String::new();
        std::fs::File::from(fd).read_to_string(&mut text)?;
        Ok(text)
    }

    /// Whether it is a regular file (through symlinks that stay beneath the root).
    pub fn is_file(&self) -> bool {
        self.root_fd()
            .and_then(|root| {
                Ok(open_beneath(
                    &root,
                    &self.rel,
                    OFlags::PATH | OFlags::CLOEXEC,
                    Mode::empty(),
                )?)
            })
            .and_then(|fd| Ok(rustix::fs::fstat(&fd)?))
            .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file())
    }

    /// Writes `contents`, making the directories on the way.
    pub fn write(&self, contents: &str) -> std::io::Result<()> {
        let root = self.root_fd()?;
        let parent = self.parent_fd(&root, true)?;
        let fd = open_beneath(
            &parent,
            Path::new(self.name()),
            OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC,
            Mode::from(0o666),
        )?;
        std::fs::File::from(fd).write_all(contents.as_bytes())
    }

    /// Deletes the file (in the directory found beneath the root).
    pub fn remove(&self) -> std::io::Result<()> {
        let root = self.root_fd()?;
        let parent = self.parent_fd(&root, false)?;
        Ok(rustix::fs::unlinkat(
            &parent,
            self.name(),
            AtFlags::empty(),
        )?)
    }
}

fn open_beneath(
    dir: &OwnedFd,
    path: &Path,
    flags: OFlags,
    mode: Mode,
) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(dir, path, flags, mode, ResolveFlags::BENEATH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reads_and_deletes_beneath_the_root_and_never_outside() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let at = |rel: &str| Beneath {
            root: root.path().to_path_buf(),
            rel: rel.into(),
        };
        at("a/b/c.txt").write("one\n").unwrap();
        assert_eq!(at("a/b/c.txt").read().unwrap(), "one\n");
        assert!(at("a/b/c.txt").is_file());
        // A symlink that stays inside is followed.
        std::os::unix::fs::symlink("b", root.path().join("a/inner")).unwrap();
        assert_eq!(at("a/inner/c.txt").read().unwrap(), "one\n");
        // A directory swapped for a symlink leading out: nothing is read or written there.
        std::fs::write(outside.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("out")).unwrap();
        assert!(at("out/secret").read().is_err());
        assert!(at("out/new.txt").write("x").is_err());
        assert!(at("out/deeper/new.txt").write("x").is_err());
        assert!(!at("out/secret").is_file());
        assert!(at("out/secret").remove().is_err());
        assert!(!outside.path().join("new.txt").exists());
        assert!(!outside.path().join("deeper").exists());
        assert!(outside.path().join("secret").exists());
        // An absolute symlink is refused even when it names a place inside.
        std::os::unix::fs::symlink(root.path().join("a"), root.path().join("abs")).unwrap();
        assert!(at("abs/b/c.txt").read().is_err());
        at("a/b/c.txt").remove().unwrap();
        assert!(!root.path().join("a/b/c.txt").exists());
    }

    #[test]
    fn a_path_is_placed_under_the_first_root_that_holds_it() {
        let roots = [PathBuf::from("/ws/one"), PathBuf::from("/ws/two")];
        assert_eq!(
            Beneath::of(&roots, Path::new("/ws/two/x/y")),
            Some(Beneath {
                root: "/ws/two".into(),
                rel: "x/y".into()
            })
        );
        assert_eq!(
            Beneath::of(&roots, Path::new("/ws/one")),
            None,
            "the root itself"
        );
        assert_eq!(Beneath::of(&roots, Path::new("/elsewhere/x")), None);
    }
}
