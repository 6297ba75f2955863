//! MULTI / EXEC / DISCARD. A transaction queues resolved commands. EXEC checks each again (the
//! ACL may have changed since it was queued), parses it, and refuses commands of several
//! namespaces (CROSSSLOT) before anything runs. Its engine commands then run as one batch on
//! their namespace's shard, acquires without waiting, at one instant: nothing (an expiry,
//! another client's command) happens between two of them. This file decides what EXEC runs, as
//! a [`Plan`]; dispatch.rs runs the plan in queue order.

use bytes::Bytes;

use super::acl::User;
use super::clients::Client;
use super::cluster;
use super::global::Global;
use super::msg::Call;
use super::session::check_permissions;
use crate::command::table::Flag;
use crate::command::{self, CommandSpec, Request};
use crate::error::Error;
use crate::protocol::Reply;

/// An open transaction.
pub struct Transaction {
    queued: Vec<(&'static CommandSpec, Vec<Bytes>)>,
    /// A command was refused while queueing: EXEC answers EXECABORT.
    dirty: bool,
}

/// What EXEC runs.
pub struct Plan {
    /// The shard of the transaction's namespace (`None`: no engine command).
    pub shard: Option<usize>,
    /// One per queued command, in queue order.
    pub steps: Vec<Step>,
}

/// One queued command of a [`Plan`].
pub enum Step {
    /// An engine command of the transaction's namespace, run in the batch on its shard.
    Engine(Call),
    /// Any other command (NS.LIST, INFO, a surface command), with its table entry (its
    /// statistics are counted under it).
    Run(&'static CommandSpec, Request),
    /// Refused when EXEC checked it again, or when parsed, with the command's table entry.
    Failed(&'static CommandSpec, Error),
}

/// MULTI.
pub fn start(tx: &mut Option<Transaction>, client: &Client) -> Reply {
    if tx.is_some() {
        // As Redis: an error, and the transaction goes on.
        return Reply::Error(Error::Err("MULTI calls can not be nested".into()));
    }
    *tx = Some(Transaction {
        queued: Vec::new(),
        dirty: false,
    });
    client.set_multi(Some(0));
    Reply::OK
}

/// DISCARD.
pub fn discard(tx: &mut Option<Transaction>, client: &Client) -> Reply {
    if tx.take().is_none() {
        return Reply::Error(Error::Err("DISCARD without MULTI".into()));
    }
    client.set_multi(None);
    Reply::OK
}

/// EXEC's first step: ends the transaction, which may not run (never opened, or refused a
/// command while queueing): the error then is the reply.
pub fn take(tx: &mut Option<Transaction>, client: &Client) -> Result<Transaction, Reply> {
    let Some(t) = tx.take() else {
        return Err(Reply::Error(Error::Err("EXEC without MULTI".into())));
    };
    client.set_multi(None);
    if t.dirty {
        return Err(Reply::Error(Error::ExecAbort(
            "Transaction discarded because of previous errors.".into(),
        )));
    }
    Ok(t)
}

impl Transaction {
    /// Queues a command (it runs at EXEC), or refuses one that may not run in a transaction.
    pub fn queue(
        &mut self,
        spec: &'static CommandSpec,
        argv: Vec<Bytes>,
        client: &Client,
    ) -> Reply {
        if spec.flags.has(Flag::NoMulti) {
            self.dirty = true;
            return Reply::Error(Error::Err(
                "Command not allowed inside a transaction".into(),
            ));
        }
        self.queued.push((spec, argv));
        client.set_multi(Some(self.queued.len()));
        Reply::simple("QUEUED")
    }

    /// Whether a queued command may add state (flag `denyoom`): past `--maxmemory`, EXEC
    /// refuses the whole transaction, as Redis does.
    pub fn adds_state(&self) -> bool {
        self.queued
            .iter()
            .any(|(spec, _)| spec.flags.has(Flag::DenyOom))
    }

    /// What cluster mode answers EXEC instead, as Redis Cluster does: the refusal (`MOVED`,
    /// `CLUSTERDOWN`) of the first queued command for a slot this node does not serve, as the
    /// node is now (it may have lost its leadership since the commands were queued).
    pub fn refusal(&self, g: &Global) -> Option<Error> {
        self.queued
            .iter()
            .find_map(|(spec, argv)| cluster::refusal(g, spec, argv))
    }

    /// A command was refused while queueing: EXEC will refuse the transaction.
    pub fn abort(&mut self) {
        self.dirty = true;
    }

    /// What EXEC runs, as `user` now (`None`: logged out meanwhile); CROSSSLOT when the engine
    /// commands touch more than one namespace.
    pub fn plan(self, user: Option<&User>, g: &Global) -> Result<Plan, Reply> {
        let parsed: Vec<Result<Request, Error>> = self
            .queued
            .iter()
            .map(|(spec, argv)| {
                let Some(user) = user else {
                    return Err(Error::NoAuth("Authentication required.".into()));
                };
                check_permissions(user, spec, argv).map_err(|_| {
                    Error::NoPerm(format!(
                        "ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following user: '{}'",
                        user.name
                    ))
                })?;
                command::parse(spec, argv, &g.limits)
            })
            .collect();
        let mut namespace = None;
        for r in parsed.iter().flatten() {
            if let Request::Engine(e) = r {
                if let Some(ns) = e.namespace() {
                    if namespace.is_some_and(|n| n != ns) {
                        return Err(Reply::Error(Error::CrossSlot(
                            "Keys in request don't hash to the same slot".into(),
                        )));
                    }
                    namespace = Some(ns);
                }
            }
        }
        let shard = namespace.map(|ns| g.shard_of(ns));
        let steps = self
            .queued
            .iter()
            .map(|&(spec, _)| spec)
            .zip(parsed)
            .map(|(spec, r)| match r {
                Ok(Request::Engine(req)) if req.namespace().is_some() => {
                    Step::Engine(Call { spec, req })
                }
                Ok(other) => Step::Run(spec, other),
                Err(e) => Step::Failed(spec, e),
            })
            .collect();
        Ok(Plan { shard, steps })
    }
}
