//! A client's response body: its replay, then its queue, with every frame counted in the
//! queue's bytes until hyper has written it (ARCHITECTURE.md § The live stream).
//!
//! hyper takes a body frame whenever its write buffer has room (under 64 KiB and 16 buffers,
//! `Server`'s `max_buf_size`) and keeps it until the socket has taken every byte. A frame
//! the body handed over is therefore still memory the client pins: its bytes stay counted in
//! [`ClientShared::queued_bytes`] until hyper drops the chunk ([`Counted`]), so a stalled
//! client holds at most `queue_bytes` (plus one frame), not that plus what hyper holds.
//! Frames larger than [`COPY_MAX`] are handed over as they are (the `Bytes` the backlog and
//! every other client share), so stalled clients holding the same frames hold them once;
//! smaller ones are copied together into chunks of at most [`CHUNK_BYTES`], so a busy stream
//! costs hyper one buffer per chunk, not one per event.

use super::{ClientShared, Hub, Out, control_frame};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

/// Frames taken from the queue at once.
const TAKE_FRAMES: usize = 64;
/// A frame up to this size is copied into a chunk with its neighbours; a larger one is
/// handed to hyper as it is (shared, not copied).
const COPY_MAX: usize = 16 * 1024;
/// The most bytes of copied frames in one chunk.
const CHUNK_BYTES: usize = 64 * 1024;

/// A client's response body: what it is sent first, then its queue. Dropping it (the client
/// left, or the connection ended) removes the client at once.
///
/// Invariant: every frame taken from `rx` is in `held` or in a chunk handed to hyper, and its
/// bytes stay in `shared.queued_bytes` until that chunk is dropped.
pub(crate) struct EventBody {
    prefix: VecDeque<Bytes>,
    rx: tokio::sync::mpsc::Receiver<Out>,
    /// Taken from the queue, not yet handed to hyper.
    held: VecDeque<Out>,
    shared: Arc<ClientShared>,
    hub: Arc<Hub>,
    id: u64,
    done: bool,
}

/// A chunk handed to hyper, whose frames' bytes leave the queue's count when hyper drops it
/// (written, or the connection ended).
struct Counted {
    data: Bytes,
    counted: usize,
    shared: Arc<ClientShared>,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.shared
            .queued_bytes
            .fetch_sub(self.counted, Ordering::Relaxed);
    }
}

impl EventBody {
    pub(super) fn new(
        prefix: VecDeque<Bytes>,
        rx: tokio::sync::mpsc::Receiver<Out>,
        shared: Arc<ClientShared>,
        hub: Arc<Hub>,
        id: u64,
    ) -> EventBody {
        EventBody {
            prefix,
            rx,
            held: VecDeque::new(),
            shared,
            hub,
            id,
            done: false,
        }
    }

    fn dropped_frame(&self, count: u64) -> Bytes {
        control_frame(
            "dropped",
            &serde_json::json!({
                "count": count,
                "reason": "client_queue_full",
                "total": self.shared.lost.load(Ordering::Relaxed),
            }),
        )
    }

    /// The next chunk from `held` (not empty): a large frame alone, or small ones copied
    /// together, each preceded by the notice of the losses just before it.
    fn next_chunk(&mut self) -> Bytes {
        let first = self.held.front().map_or(0, |o| o.bytes.len());
        if first > COPY_MAX {
            let o = self.held.front_mut().expect("held is not empty");
            if o.lost_before > 0 {
                // The notice goes first, on its own; the frame follows at the next poll.
                let lost = std::mem::take(&mut o.lost_before);
                return self.dropped_frame(lost);
            }
            let o = self.held.pop_front().expect("held is not empty");
            return self.counted(o.bytes.clone(), o.bytes.len());
        }
        let mut chunk = BytesMut::new();
        let mut counted = 0;
        while let Some(o) = self.held.front() {
            let len = o.bytes.len();
            if len > COPY_MAX || (counted > 0 && counted + len > CHUNK_BYTES) {
                break;
            }
            let o = self.held.pop_front().expect("front exists");
            if o.lost_before > 0 {
                chunk.put_slice(&self.dropped_frame(o.lost_before));
            }
            chunk.put_slice(&o.bytes);
            counted += len;
        }
        self.counted(chunk.freeze(), counted)
    }

    fn counted(&self, data: Bytes, counted: usize) -> Bytes {
        Bytes::from_owner(Counted {
            data,
            counted,
            shared: self.shared.clone(),
        })
    }

    /// After the queue ended: the notice of losses not yet told, then `shutdown` (when the
    /// hub closed), then the end of the body.
    fn last_frames(&mut self) -> Option<Bytes> {
        let lost = self.shared.unannounced.swap(0, Ordering::Relaxed);
        if lost > 0 {
            return Some(self.dropped_frame(lost));
        }
        let shutdown = self
            .shared
            .shutdown
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if shutdown.is_none() {
            self.done = true;
        }
        shutdown
    }
}

impl Drop for EventBody {
    fn drop(&mut self) {
        self.hub.leave(self.id);
    }
}

impl http_body::Body for EventBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let data = |b| Poll::Ready(Some(Ok(http_body::Frame::data(b))));
        if let Some(b) = this.prefix.pop_front() {
            return data(b);
        }
        if this.held.is_empty() {
            let mut outs = Vec::new();
            match this.rx.poll_recv_many(cx, &mut outs, TAKE_FRAMES) {
                Poll::Ready(0) => {
                    return Poll::Ready(this.last_frames().map(|b| Ok(http_body::Frame::data(b))));
                }
                Poll::Ready(_) => this.held.extend(outs),
                Poll::Pending => {
                    // Nothing queued: losses not yet announced by a later frame are told now
                    // (they came after everything this client has been sent).
                    let lost = this.shared.unannounced.swap(0, Ordering::Relaxed);
                    if lost > 0 {
                        return data(this.dropped_frame(lost));
                    }
                    return Poll::Pending;
                }
            }
        }
        data(this.next_chunk())
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_stay_counted_until_the_chunk_that_carries_them_is_dropped() {
        let shared = Arc::new(ClientShared::default());
        let big = Bytes::from(vec![b'x'; COPY_MAX + 1]);
        let small = Bytes::from_static(b"event: a\ndata: 1\n\n");
        let mut held = VecDeque::new();
        for (bytes, lost_before) in [(small.clone(), 0), (small.clone(), 2), (big.clone(), 3)] {
            shared
                .queued_bytes
                .fetch_add(bytes.len(), Ordering::Relaxed);
            held.push_back(Out { bytes, lost_before });
        }
        let total = 2 * small.len() + big.len();
        let hub = super::super::EventHub::new(Default::default(), None).0;
        hub.open.fetch_add(1, Ordering::Relaxed);
        let (_tx, rx) = tokio::sync::mpsc::channel(1);
        let mut body = EventBody::new(VecDeque::new(), rx, shared.clone(), hub, 0);
        body.held = held;
        // The two small frames in one chunk (the notice between them), still counted.
        let a = body.next_chunk();
        assert!(a.starts_with(&small) && a.ends_with(&small), "{a:?}");
        assert!(std::str::from_utf8(&a).unwrap().contains("\"count\":2"));
        assert_eq!(shared.queued_bytes.load(Ordering::Relaxed), total);
        // The big one: its notice alone, then the frame itself, shared, not copied.
        let notice = body.next_chunk();
        assert!(
            std::str::from_utf8(&notice)
                .unwrap()
                .contains("\"count\":3")
        );
        let b = body.next_chunk();
        assert_eq!(b.as_ptr(), big.as_ptr(), "the large frame was copied");
        assert!(body.held.is_empty());
        drop(a);
        assert_eq!(shared.queued_bytes.load(Ordering::Relaxed), big.len());
        drop(notice);
        // A clone (hyper may slice the chunk) keeps it counted until the last one goes.
        let part = b.slice(10..);
        drop(b);
        assert_eq!(shared.queued_bytes.load(Ordering::Relaxed), big.len());
        drop(part);
        assert_eq!(shared.queued_bytes.load(Ordering::Relaxed), 0);
    }
}
