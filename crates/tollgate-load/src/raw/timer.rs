//! A one-shot timer precise to microseconds that the engine waits on together with its sockets.
//!
//! tokio's timer rounds up to the millisecond: at 50,000 requests/s, 50 requests would be due in
//! each of its ticks and go out together. On Linux this is a timerfd (`CLOCK_MONOTONIC`, the
//! clock of `Instant`) registered with the runtime like a socket, so one `epoll_wait` covers the
//! answers and the next send. Elsewhere it falls back to tokio's timer, and its millisecond.

use std::io;
use std::task::{Context, Poll};
use std::time::Instant;

#[cfg(target_os = "linux")]
pub(super) use self::linux::Timer;
#[cfg(not(target_os = "linux"))]
pub(super) use self::portable::Timer;

#[cfg(target_os = "linux")]
mod linux {
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    use rustix::time::{Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, Timespec};
    use tokio::io::unix::AsyncFd;

    use super::*;

    /// A timerfd, armed for one instant at a time.
    pub(in crate::raw) struct Timer {
        fd: AsyncFd<OwnedFd>,
        armed: Option<Instant>,
    }

    impl Timer {
        /// A timer not armed; must be made inside the runtime that polls it.
        pub(in crate::raw) fn new() -> io::Result<Timer> {
            let fd = rustix::time::timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
            )?;
            // Deprecated because a type's `as_raw_fd` could change or close the descriptor under
            // the registration; an `OwnedFd` owns one descriptor for its whole life, which is
            // what `register` (unsafe, and this crate has no unsafe code) asks the caller to ensure.
            #[allow(deprecated)]
            let fd = AsyncFd::new(fd)?;
            Ok(Timer { fd, armed: None })
        }

        /// Fires at `at` (at once if it has passed), instead of when it was set for.
        pub(in crate::raw) fn arm(&mut self, at: Instant) -> io::Result<()> {
            if self.armed == Some(at) {
                return Ok(());
            }
            // A zero time would disarm it.
            let after = at.saturating_duration_since(Instant::now()).max(Duration::from_nanos(1));
            let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
            let value = Timespec {
                tv_sec: i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
                tv_nsec: i64::from(after.subsec_nanos()),
            };
            rustix::time::timerfd_settime(
                self.fd.get_ref(),
                TimerfdTimerFlags::empty(),
                &Itimerspec { it_interval: zero, it_value: value },
            )?;
            self.armed = Some(at);
            Ok(())
        }

        /// Ready once the time armed for has come.
        pub(in crate::raw) fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            loop {
                let mut ready = match self.fd.poll_read_ready(cx) {
                    Poll::Ready(Ok(ready)) => ready,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                };
                let mut expirations = [0u8; 8];
                match rustix::io::read(ready.get_inner(), &mut expirations) {
                    Ok(_) => {
                        self.armed = None;
                        return Poll::Ready(Ok(()));
                    }
                    Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                    Err(e) => return Poll::Ready(Err(e.into())),
                }
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod portable {
    use std::future::Future;
    use std::pin::Pin;

    use super::*;

    /// tokio's timer (1 ms).
    pub(in crate::raw) struct Timer {
        sleep: Pin<Box<tokio::time::Sleep>>,
        armed: Option<Instant>,
    }

    impl Timer {
        pub(in crate::raw) fn new() -> io::Result<Timer> {
            Ok(Timer { sleep: Box::pin(tokio::time::sleep(std::time::Duration::ZERO)), armed: None })
        }

        pub(in crate::raw) fn arm(&mut self, at: Instant) -> io::Result<()> {
            if self.armed != Some(at) {
                self.sleep.as_mut().reset(tokio::time::Instant::from_std(at));
                self.armed = Some(at);
            }
            Ok(())
        }

        pub(in crate::raw) fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            if self.armed.is_none() {
                return Poll::Pending;
            }
            self.sleep.as_mut().poll(cx).map(|()| {
                self.armed = None;
                Ok(())
            })
        }
    }
}
