//! The session map: one emitter per (agent, session), kept while it is in use or has events
//! in the ring, released when idle, bounded in number and in bytes (ARCHITECTURE.md § Ingest).
//!
//! # The rules
//!
//! * **One emitter per key.** Every caller of [`Sessions::get`] for the same (agent, session)
//!   gets the same emitter while the key is held, whatever thread or connection it comes from,
//!   so their events keep the order in which they claimed ring slots.
//! * **Pinned while used.** A [`SessionEmitter`] pins its entry; a pinned entry is never
//!   released. After each queued event it notes the ring's tail, and when it is dropped it
//!   leaves that tail and the time in the entry.
//! * **In flight.** An entry has events in flight while the ring's consumer has not read up to
//!   the tail noted last (`Ring::read_position`, one acquire load). Only an entry neither pinned
//!   nor in flight may be released.
//! * **Released when idle** for [`SessionOptions::idle`] (10 s): each `get` examines the next
//!   two entries of its shard in turn and releases them if they are idle that long;
//!   [`Sessions::sweep`] releases every idle one at once.
//! * **Bounded.** At most [`SessionOptions::max`] (4,096) entries and
//!   [`SessionOptions::max_bytes`] (8 MiB) of them, in 16 shards of `max / 16` entries and
//!   `max_bytes / 16` bytes each (one shard below 256 entries), the key's hash choosing the
//!   shard. An entry's bytes are its names' plus what an entry always takes
//!   ([`ENTRY_BYTES`]: its slot, its emitter's allocations). A new key whose shard is full, in
//!   entries or in bytes, takes the place of entries that are neither pinned nor in flight,
//!   idle or not (the clock algorithm: one not used since the hand last passed it first),
//!   counted as `evicted`; when every entry of the shard is pinned or in flight, the key is
//!   **refused** ([`Refused`]) and counted. A key whose agent or session name is longer than
//!   [`MAX_NAME_BYTES`] (256 bytes) is refused whatever the map holds.
//! * **`seq` goes on.** A released key's next `seq` is remembered (at most
//!   [`SessionOptions::remember`] keys, 65,536, the oldest forgotten first); when the key comes
//!   back its new emitter continues from it, on the same ring (the key's hash chooses it), so
//!   order and numbering are as if it had never been released. A key whose number was
//!   forgotten starts again at 0.
//!
//! Nothing here is on `Emitter::emit`'s path: an agent holding its own emitter pays nothing.
//! A use through the map costs two short locks of its shard (find or create and pin; unpin),
//! one `Instant::now`, and one load of the ring's tail per queued event.

use super::memory::SeqMemory;
use super::tokens::{AgentTokens, ByAgent, Tokens};
use crate::emitter::{Emit, Emitter, Lane, Producers};
use crate::event::{Event, Extras, ExtrasError};
use crate::ndjson::MAX_NAME_BYTES;
use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use serde::Serialize;
use std::cell::Cell;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The stats section's name: `stats.sessions()`, `"sessions"` in `/api/stats` and `run`'s report.
pub const STATS_SECTION: &str = "sessions";

/// Shards when `max` is at least this many entries per shard times [`SHARDS`].
const SHARDS: usize = 16;
const MIN_PER_SHARD: usize = 16;
/// Entries a `get` examines for the idle rule.
const IDLE_STEPS: usize = 2;

/// What an entry takes besides its names, in bytes: its slot, its places in the index and the
/// free list, and its emitter's allocations (about 700 bytes on x86-64).
pub const ENTRY_BYTES: usize =
    std::mem::size_of::<Slot>() + 2 * std::mem::size_of::<usize>() + Emitter::heap_bytes(0);

/// The bytes an entry for these names takes: its names and [`ENTRY_BYTES`].
const fn entry_bytes(agent: &str, session: &str) -> usize {
    ENTRY_BYTES + agent.len() + session.len()
}

/// The most one entry takes (both names of [`MAX_NAME_BYTES`]): every shard holds at least this
/// many bytes, so a key that may enter the map always fits in an empty shard.
const LARGEST_ENTRY: usize = ENTRY_BYTES + 2 * MAX_NAME_BYTES;

/// How many emitters [`Sessions`] holds and for how long; `HooksBuilder::sessions`.
///
/// # Examples
///
/// ```
/// use prx_hooks::ingest::SessionOptions;
/// use std::time::Duration;
/// let opts = SessionOptions::default().max(1024).idle(Duration::from_secs(30));
/// assert_eq!((opts.max_entries(), opts.idle_time()), (1024, Duration::from_secs(30)));
/// assert_eq!(opts.max_held_bytes(), 8 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    max: usize,
    max_bytes: usize,
    idle: Duration,
    remember: usize,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            max: 4096,
            max_bytes: 8 << 20,
            idle: Duration::from_secs(10),
            remember: 65_536,
        }
    }
}

impl SessionOptions {
    /// Emitters held at most (default 4,096; at least 1).
    pub fn max(mut self, entries: usize) -> Self {
        self.max = entries.max(1);
        self
    }

    /// Bytes the entries take at most: their names plus [`ENTRY_BYTES`] each (default 8 MiB).
    /// 4,096 entries whose names both have the longest length ([`MAX_NAME_BYTES`]) take about
    /// 5 MiB, so with the default `max` the count binds first; with a larger `max` this does.
    /// Each shard holds at least one entry of the longest names, whatever this says.
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// How long an entry with nothing in flight is kept after its last use (default 10 s).
    pub fn idle(mut self, idle: Duration) -> Self {
        self.idle = idle;
        self
    }

    /// Released keys whose next `seq` is remembered (default 65,536; 0: none, a key made again
    /// starts at 0). About 50 bytes each.
    pub fn remember(mut self, keys: usize) -> Self {
        self.remember = keys;
        self
    }

    /// The most emitters held (see [`SessionOptions::max`]).
    pub fn max_entries(&self) -> usize {
        self.max
    }

    /// The most bytes the entries take (see [`SessionOptions::max_bytes`]).
    pub fn max_held_bytes(&self) -> usize {
        self.max_bytes
    }

    /// How long an idle entry is kept (see [`SessionOptions::idle`]).
    pub fn idle_time(&self) -> Duration {
        self.idle
    }

    /// How many released keys' next `seq` is remembered (see [`SessionOptions::remember`]).
    pub fn remembered_keys(&self) -> usize {
        self.remember
    }
}

/// A new key could not get an emitter: every entry of its shard that it could replace is in
/// use or has events in flight (try again once the pipeline has moved on), or a name of the key
/// is longer than [`MAX_NAME_BYTES`] (never given). Counted in `stats.sessions().refused`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused {
    max: usize,
    max_bytes: usize,
    /// The name that is too long, and its length.
    too_long: Option<(&'static str, usize)>,
}

impl Refused {
    /// Whether the key can never be given (a name longer than [`MAX_NAME_BYTES`]): asking
    /// again is of no use.
    pub fn is_permanent(&self) -> bool {
        self.too_long.is_some()
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.too_long {
            Some((field, len)) => {
                write!(f, "refused: {field}: {}", crate::ndjson::name_too_long(len))
            }
            None => write!(
                f,
                "refused: the session map holds its {} emitters or {} bytes and every one this key could replace has events in flight (SessionOptions::max, max_bytes)",
                self.max, self.max_bytes
            ),
        }
    }
}

impl std::error::Error for Refused {}

/// The session map's counters: `stats.sessions()`, section `"sessions"`.
///
/// `opened = live + released + evicted`, and every release is remembered until it is resumed
/// or forgotten: `released + evicted = remembered + resumed + forgotten` (up to keys sharing
/// a 64-bit hash, which share a record).
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SessionsStats {
    /// The bound (`SessionOptions::max`).
    pub max: u64,
    /// The bound in bytes (`SessionOptions::max_bytes`).
    pub max_bytes: u64,
    /// Entries held now.
    pub live: u64,
    /// The bytes they take: their names plus `ENTRY_BYTES` each.
    pub bytes: u64,
    /// Emitters made (a key seen first, or again after its release).
    pub opened: u64,
    /// Of `opened`, keys made again that went on from their remembered `seq`.
    pub resumed: u64,
    /// Entries released after `idle` without a use.
    pub released: u64,
    /// Entries released sooner to make room for a new key in a full shard.
    pub evicted: u64,
    /// New keys refused: their shard was full and every entry in it in use or in flight, or
    /// a name was longer than `MAX_NAME_BYTES`.
    pub refused: u64,
    /// The bound on remembered keys (`SessionOptions::remember`).
    pub remember: u64,
    /// Released keys whose next `seq` is remembered now.
    pub remembered: u64,
    /// Remembered keys forgotten to stay within `remember` (such a key starts again at 0).
    pub forgotten: u64,
    /// `SessionOptions::idle`, in milliseconds.
    pub idle_ms: u64,
    /// Tokens the ingested events carried, per agent, since start (at most
    /// [`MAX_AGENTS`](super::MAX_TOKEN_AGENTS) names; `/metrics`' `tokens_*` families).
    pub tokens: Vec<AgentTokens>,
}

/// A session the map holds, as [`Sessions::held`] lists it.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HeldSession {
    /// The agent's name.
    pub agent: String,
    /// The session id.
    pub session: String,
    /// Milliseconds since it was last used.
    pub idle_ms: u64,
    /// The tokens its events carried while held.
    #[serde(flatten)]
    pub tokens: Tokens,
}

/// The session map of one [`Hooks`](crate::Hooks): see the [module docs](crate::ingest) for the rules.
/// `Send + Sync`; [`Hooks::sessions`](crate::Hooks::sessions) gives it.
pub struct Sessions {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    hasher: std::hash::RandomState,
    producers: Arc<Producers>,
    lanes: Box<[Arc<Lane>]>,
    opts: SessionOptions,
    /// Tokens per agent since start (bounded: `tokens::MAX_AGENTS`).
    by_agent: Mutex<ByAgent>,
}

/// One shard: a slab of entries, a hash index over it, the clock hand and the seq memory.
///
/// Invariants (under the shard's lock): `index` holds exactly the occupied slots, each under
/// its `hash`; `free` exactly the empty ones; `live` is the number of occupied slots and never
/// exceeds `cap`; `bytes` is the sum of their [`entry_bytes`] and never exceeds `byte_cap`.
struct Shard {
    index: HashTable<usize>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    cap: usize,
    live: usize,
    byte_cap: usize,
    bytes: usize,
    hand: usize,
    memory: SeqMemory,
    counts: SessionsStats,
}

struct Slot {
    hash: u64,
    entry: Option<Entry>,
}

struct Entry {
    emitter: Emitter,
    /// Live [`SessionEmitter`]s of this entry.
    pins: u32,
    /// The ring's tail after the last queued event noted (none yet: nothing in flight).
    tail: Option<usize>,
    last_used: Instant,
    /// Used since the clock hand last passed (its second chance).
    recent: bool,
    /// The tokens its events carried (`ingest::tokens`).
    tokens: Tokens,
}

impl Entry {
    fn releasable(&self) -> bool {
        self.pins == 0 && self.tail.is_none_or(|t| self.emitter.ring_read_past(t))
    }
}

/// Why an entry goes.
#[derive(Clone, Copy)]
enum Why {
    Idle,
    Room,
}

impl Shard {
    fn new(cap: usize, byte_cap: usize, remember: usize) -> Shard {
        Shard {
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            cap,
            live: 0,
            byte_cap: byte_cap.max(LARGEST_ENTRY),
            bytes: 0,
            hand: 0,
            memory: SeqMemory::new(remember),
            counts: SessionsStats::default(),
        }
    }

    fn find(&self, hash: u64, agent: &str, session: &str) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| {
                slots[i]
                    .entry
                    .as_ref()
                    .is_some_and(|e| e.emitter.agent() == agent && e.emitter.session() == session)
            })
            .copied()
    }

    /// Frees slot `i` (occupied, releasable), remembers its key's next `seq`, and hands the
    /// emitter to `gone` (dropped after the lock: dropping takes other locks).
    fn release(&mut self, i: usize, why: Why, gone: &mut Vec<Emitter>) {
        let hash = self.slots[i].hash;
        let Some(entry) = self.slots[i].entry.take() else {
            return;
        };
        if let Ok(found) = self.index.find_entry(hash, |&j| j == i) {
            found.remove();
        }
        self.free.push(i);
        self.live -= 1;
        self.bytes -= entry_bytes(entry.emitter.agent(), entry.emitter.session());
        self.counts.forgotten += self.memory.park(hash, entry.emitter.next_seq());
        match why {
            Why::Idle => self.counts.released += 1,
            Why::Room => self.counts.evicted += 1,
        }
        gone.push(entry.emitter);
    }

    /// The idle rule, a few entries at a time: the next `steps` slots under the hand.
    fn sweep_some(&mut self, now: Instant, idle: Duration, steps: usize, gone: &mut Vec<Emitter>) {
        for _ in 0..steps.min(self.slots.len()) {
            self.hand = (self.hand + 1) % self.slots.len();
            let i = self.hand;
            if self.slots[i].entry.as_ref().is_some_and(|e| {
                e.releasable() && now.saturating_duration_since(e.last_used) >= idle
            }) {
                self.release(i, Why::Idle, gone);
            }
        }
    }

    /// Makes room for one entry in a full shard (clock with a second chance); false when every
    /// entry is pinned or in flight.
    fn evict_one(&mut self, gone: &mut Vec<Emitter>) -> bool {
        for _ in 0..2 * self.slots.len() {
            self.hand = (self.hand + 1) % self.slots.len();
            let i = self.hand;
            let Some(e) = self.slots[i].entry.as_mut() else {
                continue;
            };
            if !e.releasable() {
                continue;
            }
            if e.recent {
                e.recent = false;
                continue;
            }
            self.release(i, Why::Room, gone);
            return true;
        }
        false
    }

    /// Makes room for an entry of `need` bytes, evicting as [`Shard::evict_one`] does; false
    /// when what is left to evict is pinned or in flight.
    fn make_room(&mut self, need: usize, gone: &mut Vec<Emitter>) -> bool {
        while self.live >= self.cap || self.bytes + need > self.byte_cap {
            if !self.evict_one(gone) {
                return false;
            }
        }
        true
    }

    fn insert(&mut self, hash: u64, emitter: Emitter, now: Instant) -> usize {
        let bytes = entry_bytes(emitter.agent(), emitter.session());
        let entry = Entry {
            emitter,
            pins: 1,
            tail: None,
            last_used: now,
            recent: true,
            tokens: Tokens::default(),
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Slot {
                    hash,
                    entry: Some(entry),
                };
                i
            }
            None => {
                self.slots.push(Slot {
                    hash,
                    entry: Some(entry),
                });
                self.slots.len() - 1
            }
        };
        let slots = &self.slots;
        self.index.insert_unique(hash, i, |&j| slots[j].hash);
        self.live += 1;
        self.bytes += bytes;
        self.counts.opened += 1;
        i
    }
}

impl Sessions {
    pub(crate) fn new(
        producers: Arc<Producers>,
        lanes: Vec<Arc<Lane>>,
        opts: SessionOptions,
    ) -> Sessions {
        let shards = if opts.max >= SHARDS * MIN_PER_SHARD {
            SHARDS
        } else {
            1
        };
        let part = |total: usize, i: usize| total / shards + usize::from(i < total % shards);
        Sessions {
            shards: (0..shards)
                .map(|i| {
                    CachePadded::new(Mutex::new(Shard::new(
                        part(opts.max, i),
                        part(opts.max_bytes, i),
                        part(opts.remember, i),
                    )))
                })
                .collect(),
            hasher: std::hash::RandomState::new(),
            producers,
            lanes: lanes.into(),
            opts,
            by_agent: Mutex::default(),
        }
    }

    fn hash(&self, agent: &str, session: &str) -> u64 {
        self.hasher.hash_one((agent, session))
    }

    /// The shard: bits 32.. of the hash (the index uses the low bits and the top seven).
    fn shard_of(&self, hash: u64) -> usize {
        (hash >> 32) as usize % self.shards.len()
    }

    /// The ring: bits 40.., so that a key comes back to the ring its earlier events went to.
    fn lane_of(&self, hash: u64) -> &Arc<Lane> {
        &self.lanes[(hash >> 40) as usize % self.lanes.len()]
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The emitter of (agent, session), pinned until the returned handle drops: made when the
    /// key is new (continuing its remembered `seq`), refused when its shard is full of entries
    /// in use or in flight, or when a name is longer than [`MAX_NAME_BYTES`].
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Emit, Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// let sub = hooks.bus().subscribe("prx.lifecycle.*")?;
    /// let em = hooks.sessions().get("agent", "session-1")?;
    /// assert_eq!(em.emit(Event::TurnComplete), Emit::Queued);
    /// drop(em);
    /// // Another connection of the same agent gets the same emitter: seq goes on.
    /// hooks.sessions().get("agent", "session-1")?.emit(Event::TurnComplete);
    /// assert_eq!((sub.recv()?.seq(), sub.recv()?.seq()), (0, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn get(&self, agent: &str, session: &str) -> Result<SessionEmitter<'_>, Refused> {
        self.get_counted(agent, session, true)
    }

    /// [`get`](Sessions::get); `count` says whether a refusal for want of room is counted (a
    /// caller that waits for room and asks again counts the key once, when it gives up). A
    /// permanent refusal ([`Refused::is_permanent`]) is counted at once.
    pub(crate) fn get_counted(
        &self,
        agent: &str,
        session: &str,
        count: bool,
    ) -> Result<SessionEmitter<'_>, Refused> {
        if let Some((field, name)) = [("agent", agent), ("session", session)]
            .into_iter()
            .find(|(_, name)| name.len() > MAX_NAME_BYTES)
        {
            self.count_refused(agent, session);
            return Err(self.refused(Some((field, name.len()))));
        }
        let hash = self.hash(agent, session);
        let s = self.shard_of(hash);
        let now = Instant::now();
        let mut gone = Vec::new();
        let mut shard = self.lock(s);
        shard.sweep_some(now, self.opts.idle, IDLE_STEPS, &mut gone);
        let slot = match shard.find(hash, agent, session) {
            Some(i) => {
                if let Some(e) = shard.slots[i].entry.as_mut() {
                    e.pins += 1;
                }
                i
            }
            None => {
                if !shard.make_room(entry_bytes(agent, session), &mut gone) {
                    if count {
                        shard.counts.refused += 1;
                    }
                    drop(shard);
                    drop(gone);
                    return Err(self.refused(None));
                }
                let next = shard.memory.take(hash);
                if next.is_some() {
                    shard.counts.resumed += 1;
                }
                let emitter = Emitter::resuming(
                    self.producers.clone(),
                    self.lane_of(hash).clone(),
                    agent,
                    session,
                    next.unwrap_or(0),
                );
                shard.insert(hash, emitter, now)
            }
        };
        let emitter = match shard.slots[slot].entry.as_ref() {
            Some(e) => e.emitter.clone(),
            None => unreachable!("a found or inserted slot is occupied"),
        };
        drop(shard);
        drop(gone);
        Ok(SessionEmitter {
            sessions: self,
            shard: s,
            slot,
            emitter,
            tail: Cell::new(None),
            tokens: Cell::new(Tokens::default()),
        })
    }

    fn refused(&self, too_long: Option<(&'static str, usize)>) -> Refused {
        Refused {
            max: self.opts.max,
            max_bytes: self.opts.max_bytes,
            too_long,
        }
    }

    /// Counts a refusal of a caller that asked with `count: false` and gives up now.
    pub(crate) fn count_refused(&self, agent: &str, session: &str) {
        let s = self.shard_of(self.hash(agent, session));
        self.lock(s).counts.refused += 1;
    }

    /// Releases every entry that is idle now (neither pinned nor in flight, unused for
    /// `idle`); returns how many. `get` does this a few entries at a time anyway.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut released = 0;
        for s in 0..self.shards.len() {
            let mut gone = Vec::new();
            let mut shard = self.lock(s);
            let n = shard.slots.len();
            shard.sweep_some(now, self.opts.idle, n, &mut gone);
            drop(shard);
            released += gone.len();
        }
        released
    }

    /// Whether the map holds an emitter for (agent, session) now (a key released, evicted or
    /// never seen is not held; its next `get` makes one, continuing its remembered `seq`).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::Hooks;
    /// let hooks = Hooks::builder().build()?;
    /// assert!(!hooks.sessions().holds("agent", "s"));
    /// let em = hooks.sessions().get("agent", "s")?;
    /// assert!(hooks.sessions().holds("agent", "s"));
    /// # drop(em);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn holds(&self, agent: &str, session: &str) -> bool {
        let hash = self.hash(agent, session);
        self.lock(self.shard_of(hash))
            .find(hash, agent, session)
            .is_some()
    }

    /// The options the map was made with.
    pub fn options(&self) -> &SessionOptions {
        &self.opts
    }

    /// The counters, all shards summed.
    pub fn stats(&self) -> SessionsStats {
        let mut t = SessionsStats {
            max: self.opts.max as u64,
            max_bytes: self.opts.max_bytes as u64,
            remember: self.opts.remember as u64,
            idle_ms: self.opts.idle.as_millis() as u64,
            ..SessionsStats::default()
        };
        for s in 0..self.shards.len() {
            let shard = self.lock(s);
            let c = &shard.counts;
            t.live += shard.live as u64;
            t.bytes += shard.bytes as u64;
            t.remembered += shard.memory.len() as u64;
            t.opened += c.opened;
            t.resumed += c.resumed;
            t.released += c.released;
            t.evicted += c.evicted;
            t.refused += c.refused;
            t.forgotten += c.forgotten;
        }
        t.tokens = self
            .by_agent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .snapshot();
        t
    }

    /// The sessions held now, each with its tokens and how long since its last use, most
    /// recently used first (`GET /api/sessions`; a session's totals go with its entry when it
    /// is released).
    ///
    /// # Examples
    ///
    /// ```
    /// use prx_hooks::{Event, Hooks};
    /// let hooks = Hooks::builder().build()?;
    /// drop(hooks.sessions().get("coder", "s1")?);
    /// let held = hooks.sessions().held();
    /// assert_eq!((held[0].agent.as_str(), held[0].session.as_str()), ("coder", "s1"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held(&self) -> Vec<HeldSession> {
        let now = Instant::now();
        let mut out = Vec::new();
        for s in 0..self.shards.len() {
            let shard = self.lock(s);
            for e in shard.slots.iter().filter_map(|slot| slot.entry.as_ref()) {
                out.push(HeldSession {
                    agent: e.emitter.agent().to_string(),
                    session: e.emitter.session().to_string(),
                    idle_ms: now.saturating_duration_since(e.last_used).as_millis() as u64,
                    tokens: e.tokens,
                });
            }
        }
        out.sort_by_key(|h| h.idle_ms);
        out
    }
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("options", &self.opts)
            .finish()
    }
}

/// A key's emitter, pinned in the [`Sessions`] map while this handle lives (no release can
/// happen meanwhile). Emit through it, then drop it: the entry keeps the ring position of the
/// last event queued, so the map knows when nothing of the key is in flight any more.
pub struct SessionEmitter<'a> {
    sessions: &'a Sessions,
    shard: usize,
    slot: usize,
    emitter: Emitter,
    tail: Cell<Option<usize>>,
    /// Tokens of the events queued through this handle, added to the entry when it drops.
    tokens: Cell<Tokens>,
}

impl SessionEmitter<'_> {
    /// [`Emitter::emit`] on the key's emitter.
    pub fn emit(&self, event: Event<'_>) -> Emit {
        let r = self.emitter.emit(event);
        self.note(r);
        r
    }

    /// [`Emitter::emit_with_extras`] on the key's emitter.
    pub fn emit_with_extras(
        &self,
        event: Event<'_>,
        extras: &Extras<'_>,
    ) -> Result<Emit, ExtrasError> {
        let r = self.emitter.emit_with_extras(event, extras)?;
        self.note(r);
        Ok(r)
    }

    /// [`Emitter::emit_attached`] on the key's emitter.
    pub(crate) fn emit_attached(
        &self,
        event: Event<'_>,
        extras: Option<&Extras<'_>>,
        attached: crate::settle::Attached,
    ) -> Result<Emit, ExtrasError> {
        let r = self.emitter.emit_attached(event, extras, attached)?;
        self.note(r);
        Ok(r)
    }

    /// Counts the tokens an event queued through this handle carried (its extra fields):
    /// added to the session's and the agent's totals when the handle drops.
    pub(crate) fn count_tokens(&self, t: Tokens) {
        let mut all = self.tokens.get();
        all.add(t);
        self.tokens.set(all);
    }

    fn note(&self, r: Emit) {
        if r == Emit::Queued {
            // Our claim moved the tail past our position: this load sees at least that.
            self.tail.set(Some(self.emitter.ring_claimed()));
        }
    }

    /// The agent name of this entry's key.
    pub fn agent(&self) -> &str {
        self.emitter.agent()
    }

    /// The session id of this entry's key.
    pub fn session(&self) -> &str {
        self.emitter.session()
    }
}

impl Drop for SessionEmitter<'_> {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut shard = self.sessions.lock(self.shard);
        if let Some(e) = shard.slots[self.slot].entry.as_mut() {
            e.pins -= 1;
            if let Some(t) = self.tail.get() {
                // Tails only grow (one ring, one modification order): keep the later one.
                e.tail = Some(match e.tail {
                    Some(old) if (old.wrapping_sub(t) as isize) > 0 => old,
                    _ => t,
                });
            }
            e.last_used = now;
            e.recent = true;
            e.tokens.add(self.tokens.get());
        }
        drop(shard);
        let tokens = self.tokens.get();
        if !tokens.is_zero() {
            let mut by = self
                .sessions
                .by_agent
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            by.add(self.emitter.agent(), tokens);
        }
    }
}

impl std::fmt::Debug for SessionEmitter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionEmitter")
            .field("agent", &self.agent())
            .field("session", &self.session())
            .finish()
    }
}

impl crate::Stats {
    /// The session map's counters (always present).
    pub fn sessions(&self) -> Option<&SessionsStats> {
        self.section(STATS_SECTION)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
