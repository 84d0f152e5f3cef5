//! A three-node JetStream cluster under two relays, one fault per test: stream leader
//! step-downs, `kill -9` and SIGSTOP of the stream leader, `kill -9` of the meta leader. In a
//! binary of its own: each drill runs three servers, two relays and 20,000 events, a load the
//! `outage` binary's timing-sensitive tests must not share. Beside them, how the relay tells an
//! election from a refusal when the same server leads again.

mod drills;
mod elections;
