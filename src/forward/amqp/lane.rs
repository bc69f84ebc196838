//! A group of publishes in flight on one confirm channel. lapin hands a `basic.return` to
//! whichever confirm of the channel it resolves next, and RabbitMQ acks an unroutable publish
//! together with the routable ones confirmed before it (`multiple`), which lapin resolves in no
//! set order: the return can come with another publish's confirm. So each publish of a group
//! waits until every publish of its group has its confirm and only then asks whether a return
//! carried its `message_id` (a return always comes before the ack of its publish, and the
//! channel carries no other group meanwhile). Groups are small, so a channel still carries
//! many publishes in flight and the broker acks them several at a time.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use lapin::Channel;
use lapin::message::BasicReturnMessage;
use tokio::sync::watch;

/// The most publishes a group holds: `concurrency` publishes in flight use about
/// `concurrency / GROUP` channels.
const GROUP: usize = 16;

pub struct Lane {
    pub channel: Channel,
    state: Mutex<State>,
    done: watch::Sender<bool>,
}

#[derive(Default)]
struct State {
    joined: usize,
    pending: usize,
    /// Joined by no one else: full, or each publish of it is over.
    closed: bool,
    /// A publish of the group got no confirm: a return for another may have come with it.
    broken: bool,
    /// By `message_id`: the reply code and text of each return the group's confirms carried.
    returned: HashMap<String, (u16, String)>,
}

/// What the group's confirms said of one publish, once all of them came.
pub enum Settled {
    Clear,
    Returned(u16, String),
    /// Another publish of the group got no confirm, and with it maybe this one's return.
    Unknown,
}

impl Lane {
    /// A group on `channel` whose first publish is the caller's.
    pub fn first(channel: Channel) -> Place {
        let lane = Lane {
            channel,
            state: Mutex::new(State::default()),
            done: watch::Sender::new(false),
        };
        let lane = Arc::new(lane);
        lane.state().joined = 1;
        lane.state().pending = 1;
        Place { lane, over: false }
    }

    /// A place in the group, if it is still open.
    pub fn join(self: &Arc<Lane>) -> Option<Place> {
        let mut state = self.state();
        if state.closed || !self.channel.status().connected() {
            return None;
        }
        state.joined += 1;
        state.pending += 1;
        state.closed = state.joined >= GROUP;
        Some(Place {
            lane: self.clone(),
            over: false,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One publish's place in a group: left when its confirm came (or nothing was sent), or
/// dropped (a timeout), which breaks the group.
pub struct Place {
    pub lane: Arc<Lane>,
    over: bool,
}

impl Place {
    /// This publish is over, `clean` when its confirm came or nothing was sent, with the return
    /// its confirm carried. The channel when the group is over and it can carry another.
    pub fn leave(&mut self, clean: bool, carried: Option<&BasicReturnMessage>) -> Option<Channel> {
        self.over = true;
        let lane = &self.lane;
        let mut state = lane.state();
        if let Some(r) = carried {
            let id = r.properties.message_id().as_ref().map(|s| s.to_string());
            let reply = (r.reply_code, r.reply_text.to_string());
            state.returned.insert(id.unwrap_or_default(), reply);
        }
        state.broken |= !clean;
        state.pending -= 1;
        if state.pending > 0 {
            return None;
        }
        state.closed = true;
        let reusable = !state.broken && lane.channel.status().connected();
        drop(state);
        lane.done.send_replace(true);
        reusable.then(|| lane.channel.clone())
    }

    /// Once every publish of the group is over: whether a return carried `message_id`.
    pub async fn settled(&self, message_id: &str) -> Settled {
        let mut done = self.lane.done.subscribe();
        // The sender lives in the lane this place holds: the wait ends only with the group.
        let _ = done.wait_for(|over| *over).await;
        let state = self.lane.state();
        match state.returned.get(message_id) {
            Some((code, text)) => Settled::Returned(*code, text.clone()),
            None if state.broken => Settled::Unknown,
            None => Settled::Clear,
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.over {
            self.leave(false, None);
        }
    }
}
