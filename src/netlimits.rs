//! The accept loop and connection limits shared by the plain-HTTP listeners (`inferno proxy`
//! and `inferno keybroker`), matching what the HTTPS server does (`server::listener`): a failed
//! accept (typically EMFILE, out of file descriptors) backs off and retries instead of ending
//! the process, the number of open connections is bounded, and a client that does not send a
//! request's headers within [`HEADER_READ_TIMEOUT`] (an idle keep-alive connection included)
//! is disconnected.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioTimer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a client may take to send a request's headers, or stay idle between requests.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the accept loop waits after a failed accept before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accepts connections with a bound on how many are open at once.
pub struct Acceptor {
    listener: TcpListener,
    permits: Arc<Semaphore>,
}

/// An accepted connection; its slot is given back when this is dropped.
pub struct Accepted {
    /// The connection.
    pub stream: TcpStream,
    /// The client's address.
    pub peer: SocketAddr,
    /// The connection's slot among the open connections.
    pub permit: OwnedSemaphorePermit,
}

impl Acceptor {
    /// An acceptor on `listener` that keeps at most `max_connections` open.
    pub fn new(listener: TcpListener, max_connections: usize) -> Self {
        Self {
            listener,
            permits: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }

    /// The next connection. Waits for a free slot first; an accept that fails (out of file
    /// descriptors, a connection reset before it was accepted) is logged and retried after a
    /// short back-off, never returned.
    pub async fn accept(&self) -> Accepted {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => {
                    return Accepted {
                        stream,
                        peer,
                        permit,
                    };
                }
                Err(err) => {
                    tracing::warn!(error = %err, "accepting a connection failed; backing off");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }
}

/// An HTTP/1.1 server connection builder that cuts slow or idle clients after
/// [`HEADER_READ_TIMEOUT`].
pub fn http1_builder() -> hyper::server::conn::http1::Builder {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    builder
}
