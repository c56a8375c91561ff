//! Hot reload of the limits file.
//!
//! The file's directory is watched, not the file: editors save by writing a new file and renaming
//! it over the old one, and Kubernetes swaps a `..data` symlink in the directory; either way the
//! watched path's inode changes and a watch on the file itself would go quiet. Any event in the
//! directory re-reads the file; a content equal to the last one read is ignored. A file that does
//! not parse is logged and counted, and the last good limits stay in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tollgate::Clock;
use tollgate_policy::{Policy, PolicyError};

use super::engine::Engine;
use super::metrics::Metrics;

/// Editors write a file in several steps; wait this long after the first event before reading.
const SETTLE: Duration = Duration::from_millis(50);

/// Reloads one limits file into one engine.
pub struct Reloader<C: Clock> {
    path: PathBuf,
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    last: Mutex<Option<String>>,
}

/// What a reload did.
#[derive(Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The file's content is what is loaded already.
    Unchanged,
    /// New limits are in force, with this generation.
    Applied(u64),
}

impl<C: Clock + Clone> Reloader<C> {
    /// A reloader for `path`, whose current content `loaded_text` is already in force.
    pub fn new(path: &Path, loaded_text: String, engine: Arc<Engine<C>>, metrics: Arc<Metrics>) -> Reloader<C> {
        Reloader { path: path.to_path_buf(), engine, metrics, last: Mutex::new(Some(loaded_text)) }
    }

    /// Reads the file and applies it if it changed; on error the last good limits stay.
    pub fn reload(&self) -> Result<Reloaded, PolicyError> {
        let name = self.path.display().to_string();
        let result = Policy::read(&self.path).and_then(|text| {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.as_deref() == Some(text.as_str()) {
                return Ok(Reloaded::Unchanged);
            }
            let policy = Policy::parse(&text, &name)?;
            self.engine.accepts(&policy).map_err(|e| PolicyError::new(&name, e.position, e.message()))?;
            let generation = self.engine.reload(policy);
            *last = Some(text);
            Ok(Reloaded::Applied(generation))
        });
        match &result {
            Ok(Reloaded::Applied(generation)) => {
                self.metrics.reload_succeeded();
                tracing::info!(generation, file = %name, "limits reloaded");
            }
            Ok(Reloaded::Unchanged) => {}
            Err(e) => {
                self.metrics.reload_failed(&e.to_string());
                tracing::error!("limits not reloaded, the last good ones stay in force: {e}");
            }
        }
        result
    }

    /// Watches the file's directory and reloads on every change until the returned watcher is
    /// dropped. Needs a tokio runtime.
    pub fn watch(self: Arc<Self>) -> notify::Result<RecommendedWatcher> {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            if event.is_ok() {
                let _ = tx.send(());
            }
        })?;
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
        tokio::spawn(async move {
            while rx.recv().await.is_some() {
                tokio::time::sleep(SETTLE).await;
                while rx.try_recv().is_ok() {}
                let _ = self.reload();
            }
        });
        Ok(watcher)
    }
}

impl<C: Clock> std::fmt::Debug for Reloader<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").field("path", &self.path).field("engine", &self.engine).finish_non_exhaustive()
    }
}
