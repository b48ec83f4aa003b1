//! Bounds on connections, for every listener: at most `max` open at once (one more is closed
//! as soon as it is accepted, and counted), and a connection that moves no byte either way for
//! `idle_timeout` is closed (HTTP/1 keep-alive and HTTP/2 alike, before or after the TLS
//! handshake, before or after the first request).
//!
//! Hyper bounds only the HTTP/1 header read; an HTTP/2 connection idle after its preface, or a
//! TLS connection that never sends a request, stayed open for as long as the client liked.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum_server::accept::{Accept, DefaultAcceptor};
use futures::future::{Either, Ready, ready};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The default of [`ConnectionLimits::max`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

/// The default of [`ConnectionLimits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How many connections may be open and how long one may stay idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once on one listener.
    pub max: usize,
    /// Time without a byte read or written after which a connection is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionLimits {
    /// [`DEFAULT_MAX_CONNECTIONS`] and [`DEFAULT_IDLE_TIMEOUT`].
    fn default() -> Self {
        ConnectionLimits {
            max: DEFAULT_MAX_CONNECTIONS,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// What the guard counts.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    /// Connections open now.
    pub open: IntGauge,
    /// Connections closed at once because `max` were open.
    pub rejected: IntCounter,
    /// Connections closed for being idle.
    pub idle_closed: IntCounter,
}

impl ConnectionMetrics {
    /// The three series, named `{prefix}_open_connections`,
    /// `{prefix}_connections_rejected_total` and `{prefix}_connections_idle_closed_total`,
    /// registered on `registry`.
    pub fn register(registry: &Registry, prefix: &str) -> Result<Self, prometheus::Error> {
        let metrics = ConnectionMetrics {
            open: IntGauge::new(
                format!("{prefix}_open_connections"),
                "Connections open on the process's listeners.",
            )?,
            rejected: IntCounter::new(
                format!("{prefix}_connections_rejected_total"),
                "Connections closed as soon as accepted because the most allowed were open on that listener.",
            )?,
            idle_closed: IntCounter::new(
                format!("{prefix}_connections_idle_closed_total"),
                "Connections closed because no byte moved for the idle timeout.",
            )?,
        };
        registry.register(Box::new(metrics.open.clone()))?;
        registry.register(Box::new(metrics.rejected.clone()))?;
        registry.register(Box::new(metrics.idle_closed.clone()))?;
        Ok(metrics)
    }
}

/// An acceptor that applies [`ConnectionLimits`] before handing the stream to `inner` (a TLS
/// acceptor wraps this one, so the handshake itself is bounded too).
#[derive(Clone, Debug)]
pub struct GuardAcceptor<A = DefaultAcceptor> {
    inner: A,
    permits: Arc<Semaphore>,
    idle_timeout: Duration,
    metrics: ConnectionMetrics,
}

impl GuardAcceptor {
    /// A guard in front of the plain acceptor.
    pub fn new(limits: ConnectionLimits, metrics: ConnectionMetrics) -> Self {
        GuardAcceptor {
            inner: DefaultAcceptor::new(),
            permits: Arc::new(Semaphore::new(limits.max)),
            idle_timeout: limits.idle_timeout,
            metrics,
        }
    }
}

impl<A> GuardAcceptor<A> {
    /// The same guard in front of `inner`.
    pub fn acceptor<B>(self, inner: B) -> GuardAcceptor<B> {
        GuardAcceptor {
            inner,
            permits: self.permits,
            idle_timeout: self.idle_timeout,
            metrics: self.metrics,
        }
    }
}

impl<A, I, S> Accept<I, S> for GuardAcceptor<A>
where
    A: Accept<GuardedStream<I>, S>,
    I: AsyncRead + AsyncWrite + Unpin,
{
    type Stream = A::Stream;
    type Service = A::Service;
    type Future = Either<A::Future, Ready<io::Result<(A::Stream, A::Service)>>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                let guarded = GuardedStream::new(stream, permit, self.idle_timeout, &self.metrics);
                Either::Left(self.inner.accept(guarded, service))
            }
            Err(_) => {
                self.metrics.rejected.inc();
                Either::Right(ready(Err(io::Error::other("too many open connections"))))
            }
        }
    }
}

/// A stream that holds one of the listener's connection permits and fails with `TimedOut`
/// once it has been idle for the timeout.
#[derive(Debug)]
pub struct GuardedStream<S> {
    inner: S,
    idle_timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    open: IntGauge,
    idle_closed: IntCounter,
    _permit: OwnedSemaphorePermit,
}

impl<S> GuardedStream<S> {
    fn new(
        inner: S,
        permit: OwnedSemaphorePermit,
        idle_timeout: Duration,
        metrics: &ConnectionMetrics,
    ) -> Self {
        metrics.open.inc();
        GuardedStream {
            inner,
            idle_timeout,
            deadline: Box::pin(tokio::time::sleep(idle_timeout)),
            open: metrics.open.clone(),
            idle_closed: metrics.idle_closed.clone(),
            _permit: permit,
        }
    }

    fn active(&mut self) {
        self.deadline
            .as_mut()
            .reset(Instant::now() + self.idle_timeout);
    }

    /// A write's outcome: bytes written restart the idle clock, a pending write checks it.
    fn after_write(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        match written {
            Poll::Ready(Ok(n)) => {
                if n > 0 {
                    self.active();
                }
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.check_idle(cx),
        }
    }

    /// `Pending` while the deadline is ahead; the idle error once it has passed.
    fn check_idle<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.idle_closed.inc();
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle for too long",
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S> Drop for GuardedStream<S> {
    fn drop(&mut self) {
        self.open.dec();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for GuardedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before {
                    self.active();
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => self.check_idle(cx),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for GuardedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write(cx, data);
        self.after_write(cx, written)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.after_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
