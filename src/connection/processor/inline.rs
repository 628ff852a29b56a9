//! Running a request on the connection's reader until it first has to wait.
//!
//! Most requests never wait: a start the exec policy allows (the spawn is bounded CPU work),
//! a signal, `server/info`, a write to a pipe with room. Run on the reader, such a request
//! costs no task of its own and no hand-off between threads (a spawned task is one more wake
//! of a worker before anything happens), and its reply is queued before the reader reads on.
//! A request that does wait — behind an earlier request of its process, for an approval, for
//! room in a child's stdin, in a long poll, for room in the control lane — continues in a task
//! of its own from that first wait on.
//!
//! It must never let the reader wait on a request: only the part before the first `Pending`
//! runs here, and that part cannot wait on anything (it is polled once, with a waker that does
//! nothing; the task it moves to polls it again at once and registers its own).

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll, Waker};

/// Poll `request` once here; if it is not finished, hand it to a task of its own.
pub(super) fn run_until_first_wait(request: impl Future<Output = ()> + Send + 'static) {
    let mut request = Box::pin(request);
    let mut cx = Context::from_waker(Waker::noop());
    // A handler that panics ends its request, as a task of its own would, not the connection.
    match catch_unwind(AssertUnwindSafe(|| request.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(())) => {}
        Ok(Poll::Pending) => {
            tokio::spawn(request);
        }
        Err(_) => tracing::error!("a request handler panicked; its request is dropped"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[tokio::test]
    async fn a_request_that_does_not_wait_finishes_before_the_call_returns() {
        let done = Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        run_until_first_wait(async move {
            d.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(done.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_request_that_waits_goes_on_in_a_task_and_sees_its_wake_up() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<u32>();
        run_until_first_wait(async move {
            // Registered with the waker that does nothing first, then with the task's.
            let v = rx.await.unwrap_or(0);
            let _ = done_tx.send(v + 1);
        });
        tx.send(41).expect("the request still waits");
        let got = tokio::time::timeout(std::time::Duration::from_secs(10), done_rx)
            .await
            .expect("the request finished (hang guard)")
            .expect("the request answered");
        assert_eq!(got, 42);
    }

    #[tokio::test]
    async fn a_panicking_request_does_not_unwind_into_the_reader() {
        run_until_first_wait(async {
            panic!("handler bug");
        });
        // Reaching this line is the assertion: the reader goes on.
        let after = Arc::new(AtomicUsize::new(0));
        let a = after.clone();
        run_until_first_wait(async move {
            a.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(after.load(Ordering::SeqCst), 1);
    }
}
