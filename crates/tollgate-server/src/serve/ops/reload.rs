//! Hot reload of the limits file (or, in envoy/ratelimit's format, of the directory's files).
//!
//! The file's directory is watched, not the file ([`super::watch`] says why). A directory of
//! envoy/ratelimit files is watched itself, and every file of it read again on a change (a file
//! added, changed, renamed or removed), as envoy/ratelimit does. Any event in the directory that
//! may change content re-reads the files (opening or reading a file is an event too, and the
//! reload's own read must not trigger another one). Contents equal to the limits in force are
//! ignored. Files that do not parse are logged and counted once per version: the same bad
//! contents read again (more events, or a caller retrying) are neither logged nor counted again,
//! and the last good limits stay in force.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::RecommendedWatcher;
use tollgate::Clock;
use tollgate_policy::{Format, PolicyError, SourceText};

use super::metrics::Metrics;
use crate::serve::engine::Engine;

/// Reloads one limits path into one engine.
pub struct Reloader<C: Clock> {
    path: PathBuf,
    format: Format,
    engine: Arc<Engine<C>>,
    metrics: Arc<Metrics>,
    seen: Mutex<Seen>,
}

/// The versions of the files read so far that matter: the one in force and the last one
/// rejected. Whole texts, not hashes: limits files are small, and a hash collision would keep a
/// good version out as if it were the bad one.
struct Seen {
    loaded: Vec<SourceText>,
    /// The last version rejected and why, until a version is applied or the files are back to the
    /// limits in force.
    rejected: Option<(Vec<SourceText>, PolicyError)>,
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
    /// A reloader for `path` in `format`, whose current contents `loaded` (as [`Format::read`]
    /// gives them) are already in force.
    pub fn new(
        path: &Path,
        format: Format,
        loaded: Vec<SourceText>,
        engine: Arc<Engine<C>>,
        metrics: Arc<Metrics>,
    ) -> Reloader<C> {
        let seen = Seen { loaded, rejected: None };
        Reloader { path: path.to_path_buf(), format, engine, metrics, seen: Mutex::new(seen) }
    }

    /// Reads the files and applies them if they changed; on error the last good limits stay.
    ///
    /// A rejected version is logged and counted (`tollgate_config_reload_errors_total`) the first
    /// time it is read; reading the same content again returns the same error quietly. A file
    /// that cannot be read at all is logged and counted each time: there is no content to tell
    /// one failure from the next.
    pub fn reload(&self) -> Result<Reloaded, PolicyError> {
        let name = self.path.display().to_string();
        let text = self.format.read(&self.path).inspect_err(|e| self.rejected(e))?;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.loaded == text {
            if seen.rejected.take().is_some() {
                // Back to the limits in force (a bad edit reverted): nothing is failing any more.
                self.metrics.reload_succeeded();
                tracing::info!(file = %name, "limits file is back to the limits in force");
            }
            return Ok(Reloaded::Unchanged);
        }
        if let Some((bad, error)) = &seen.rejected
            && *bad == text
        {
            return Err(error.clone());
        }
        let applied = self.format.parse(&text).and_then(|policy| {
            self.engine.accepts(&policy).map_err(|e| PolicyError::new(&e.source_name, e.position, e.message()))?;
            Ok(self.engine.reload(policy))
        });
        match applied {
            Ok(generation) => {
                *seen = Seen { loaded: text, rejected: None };
                self.metrics.reload_succeeded();
                tracing::info!(generation, file = %name, "limits reloaded");
                Ok(Reloaded::Applied(generation))
            }
            Err(e) => {
                self.rejected(&e);
                seen.rejected = Some((text, e.clone()));
                Err(e)
            }
        }
    }

    fn rejected(&self, e: &PolicyError) {
        self.metrics.reload_failed(&e.to_string());
        tracing::error!("limits not reloaded, the last good ones stay in force: {e}");
    }

    /// Watches the file's directory (or the directory the path is) and reloads on every change
    /// until the returned watcher is dropped. Needs a tokio runtime.
    pub fn watch(self: Arc<Self>) -> notify::Result<RecommendedWatcher> {
        super::watch::on_change([super::watch::dir_of(&self.path)], move || {
            let _ = self.reload();
        })
    }
}

impl<C: Clock> std::fmt::Debug for Reloader<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}
