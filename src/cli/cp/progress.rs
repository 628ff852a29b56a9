//! `cp`'s progress bar: on a terminal's stderr, once a transfer has taken
//! [`PROGRESS_AFTER`]; nothing elsewhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::PROGRESS_AFTER;

/// A progress bar on a terminal's stderr, drawn only once the transfer has taken
/// [`PROGRESS_AFTER`]; nothing elsewhere.
pub(super) struct Progress {
    counter: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    pub(super) fn start(total: Option<u64>, what: &'static str) -> Progress {
        let counter = Arc::new(AtomicU64::new(0));
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Progress {
                counter,
                stop: None,
                task: None,
            };
        }
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let c = counter.clone();
        let task = tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(PROGRESS_AFTER) => {}
                _ = &mut stopped => return,
            }
            let bar = match total {
                Some(t) => indicatif::ProgressBar::new(t).with_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} {bar:30} {bytes}/{total_bytes} {binary_bytes_per_sec} {eta}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                ),
                None => indicatif::ProgressBar::new_spinner().with_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} {spinner} {bytes} {binary_bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
                ),
            };
            bar.set_message(what);
            loop {
                bar.set_position(c.load(Ordering::Relaxed));
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = &mut stopped => break,
                }
            }
            bar.set_position(c.load(Ordering::Relaxed));
            bar.finish_and_clear();
        });
        Progress {
            counter,
            stop: Some(stop),
            task: Some(task),
        }
    }

    pub(super) fn counter(&self) -> Arc<AtomicU64> {
        self.counter.clone()
    }

    pub(super) fn finish(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        drop(self.task.take());
    }
}
