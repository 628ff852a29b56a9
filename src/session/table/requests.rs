//! The session table's server requests (`process/approve`): registered with a deadline,
//! sent to the holder, held while detached or refused when nobody can answer, resolved by
//! the first answer.
//!
//! Part of the sans-IO core (`table.rs`): it queues actions and never performs them.

use std::time::Instant;

use super::{
    reason, Action, AnswerOutcome, ApproveParams, Handles, Registered, Resolution, SessionTable,
    Timer,
};

impl<H: Handles> SessionTable<H> {
    /// Register an approval request of session `id`, due at `now` + `approval_timeout`; its
    /// `callback` gets exactly one resolution ([`Action::Resolve`]). It is sent to the holder
    /// ([`Action::Request`]), held for the next one if the session is detached, or refused at
    /// once if the holder cannot answer. `None` if the session is gone.
    pub fn register_approval(
        &mut self,
        now: Instant,
        id: &str,
        params: ApproveParams,
        callback: impl FnOnce(Resolution) + Send + 'static,
    ) -> Option<Registered> {
        let e = self.sessions.get_mut(id)?;
        let request = e.approvals.register(params, callback);
        let can_answer = e.holder.as_ref().map(|h| h.can_answer);
        match can_answer {
            Some(false) => {
                let taken = e.approvals.take_last()?;
                self.resolve_all(vec![taken], reason::RESUMED_WITHOUT_CAPABILITY);
                Some(Registered::Refused(request))
            }
            other => {
                let key = self.arm(
                    now + self.limits.approval_timeout,
                    Timer::Approval {
                        session: id.to_string(),
                        request: request.id.clone(),
                    },
                );
                let e = self.sessions.get_mut(id)?;
                e.approval_timers.insert(request.id.clone(), key);
                match (other, &e.holder) {
                    (Some(_), Some(h)) => {
                        let to = h.conn.clone();
                        self.actions.push_back(Action::Request {
                            to,
                            request: request.clone(),
                        });
                        Some(Registered::Send(request))
                    }
                    _ => Some(Registered::Held(request)),
                }
            }
        }
    }

    /// A response from the client to request `request` of session `id`, read as
    /// `resolution`: only the first answer to a pending request takes it (and resolves it:
    /// [`Action::Resolve`]).
    pub fn answer(&mut self, id: &str, request: &str, resolution: Resolution) -> AnswerOutcome {
        let Some(e) = self.sessions.get_mut(id) else {
            return AnswerOutcome::LateOrDuplicate;
        };
        let (outcome, taken) = e.approvals.take_by_id(request);
        let key = e.approval_timers.remove(request);
        self.disarm(key);
        if let Some(request) = taken {
            self.actions.push_back(Action::Resolve {
                request,
                resolution,
            });
        }
        outcome
    }
}
