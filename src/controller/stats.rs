//! What a reconcile costs: its CPU time, summed over every poll of its future on whichever
//! thread ran it (thread CPU clocks, so time spent waiting for the API server is not counted).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The CPU time the calling thread has used.
pub fn thread_cpu_time() -> Duration {
    #[cfg(unix)]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into the timespec it is given and reads nothing else.
        let result = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
        if result == 0 {
            return Duration::new(
                u64::try_from(now.tv_sec).unwrap_or(0),
                u32::try_from(now.tv_nsec).unwrap_or(0),
            );
        }
    }
    Duration::ZERO
}

/// A future that adds up the CPU time of its polls.
pub struct CpuTimed<F> {
    inner: Pin<Box<F>>,
    cpu: Duration,
}

impl<F: Future> CpuTimed<F> {
    pub fn new(inner: F) -> Self {
        CpuTimed {
            inner: Box::pin(inner),
            cpu: Duration::ZERO,
        }
    }
}

impl<F: Future> Future for CpuTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let start = thread_cpu_time();
        let polled = self.inner.as_mut().poll(cx);
        let spent = thread_cpu_time().saturating_sub(start);
        self.cpu += spent;
        match polled {
            Poll::Ready(output) => Poll::Ready((output, self.cpu)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_shows_up_as_thread_cpu_time() {
        let start = thread_cpu_time();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_time() > start);
    }
}
