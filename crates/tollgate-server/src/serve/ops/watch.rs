//! Files the server reads again when they change: the limits ([`super::reload`]) and the TLS
//! certificates ([`crate::serve::net::tls`]).
//!
//! Directories are watched, not files: editors save by writing a new file and renaming it over
//! the old one, and Kubernetes swaps a `..data` symlink in a ConfigMap's or Secret's directory;
//! either way the file's inode changes and a watch on the file itself would go quiet.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

/// Writers change a file in several steps; wait this long after the first event before reading.
const SETTLE: Duration = Duration::from_millis(50);

/// The directory to watch for `path`: the path itself when it is a directory, else the one it is
/// in (`.` for a bare file name).
pub(crate) fn dir_of(path: &Path) -> PathBuf {
    match path.parent() {
        _ if path.is_dir() => path.to_path_buf(),
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Calls `changed` after every burst of events that may change a file in `dirs` (coalesced:
/// once per burst, [`SETTLE`] after its first event), until the returned watcher is dropped.
/// Needs a tokio runtime.
pub(crate) fn on_change(
    dirs: impl IntoIterator<Item = PathBuf>,
    mut changed: impl FnMut() + Send + 'static,
) -> notify::Result<RecommendedWatcher> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| may_change_content(&e.kind)) {
            let _ = tx.send(());
        }
    })?;
    let mut watched = Vec::new();
    for dir in dirs {
        if !watched.contains(&dir) {
            watcher.watch(&dir, RecursiveMode::NonRecursive)?;
            watched.push(dir);
        }
    }
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            changed();
        }
    });
    Ok(watcher)
}

/// False for events that cannot change a file's content: opening, reading, closing after
/// reading. Each reload opens and reads the files, so counting those would make every reload
/// schedule the next one, forever. Closing after writing counts: it is a writer finishing.
fn may_change_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}
