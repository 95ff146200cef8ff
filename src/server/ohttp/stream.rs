//! The chunked encapsulated response (draft-ietf-ohai-chunked-ohttp): the router's response as
//! an indeterminate-length Binary HTTP message, each body frame (one server-sent event) sealed
//! as its own chunk as soon as the router produces it.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::{AsyncWrite, AsyncWriteExt};
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

use super::message;
use crate::server::body::Body;

/// How many sealed frames wait for a slow reader before the sealing task waits too.
const QUEUED_FRAMES: usize = 16;

/// The sealed bytes written so far and not yet sent: the chunk writer's destination.
#[derive(Clone, Default)]
pub struct Pending(Arc<Mutex<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Bytes {
        let mut buffer = self.0.lock().unwrap_or_else(|e| e.into_inner());
        Bytes::from(std::mem::take(&mut *buffer))
    }
}

impl AsyncWrite for Pending {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut buffer = self.0.lock().unwrap_or_else(|e| e.into_inner());
        buffer.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The outer body: `response` sealed chunk by chunk through `writer` (the chunked response
/// context of the request, writing into `pending`). Dropping the body (the client went away)
/// stops the sealing task, which drops the router's response and so cancels generation.
pub fn seal_streaming<W>(writer: W, pending: Pending, response: Response<Body>) -> Body
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (frames, queue) = mpsc::channel::<Bytes>(QUEUED_FRAMES);
    tokio::spawn(async move {
        if let Err(err) = seal(writer, &pending, response, &frames).await {
            tracing::debug!(error = %err, "ohttp: the chunked response ended early");
        }
    });
    StreamBody::new(futures_util::stream::unfold(
        queue,
        |mut queue| async move {
            let bytes = queue.recv().await?;
            Some((Ok::<_, Infallible>(Frame::data(bytes)), queue))
        },
    ))
    .boxed_unsync()
}

async fn seal<W>(
    mut writer: W,
    pending: &Pending,
    response: Response<Body>,
    frames: &mpsc::Sender<Bytes>,
) -> io::Result<()>
where
    W: AsyncWrite + Unpin,
{
    let gone = || io::Error::new(io::ErrorKind::BrokenPipe, "the client went away");
    let (head, mut body) = response.into_parts();
    let head = message::response_head(&Response::from_parts(head, ())).map_err(io::Error::other)?;
    writer.write_all(&head).await?;
    frames.send(pending.take()).await.map_err(|_| gone())?;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(never) => match never {},
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        writer.write_all(&message::content_chunk(&data)).await?;
        frames.send(pending.take()).await.map_err(|_| gone())?;
    }
    writer.write_all(message::STREAM_END).await?;
    writer.close().await?;
    frames.send(pending.take()).await.map_err(|_| gone())?;
    Ok(())
}
