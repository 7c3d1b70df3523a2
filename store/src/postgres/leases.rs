//! Session leases on PostgreSQL (`session_leases`, schema version 3) and the fence check of
//! every write about a session (see [`crate::leases`] for the protocol).
//!
//! Acquiring locks the lease row (or inserts it) and takes it when it is free, expired or this
//! node's, bumping its fence. A write about a session reads the lease row `FOR SHARE` in its own
//! transaction and compares it with the fence this node holds: a takeover's `UPDATE` waits
//! for writes that read the old fence to commit, and every write after it sees the new one, so
//! a node's writes after losing the session are refused.

use super::sql::{col, exec, row, rows};
use super::{PgStore, pg_err};
use crate::leases::{Acquired, FenceVerdict, Lease, SessionLeases, expiry, fence_verdict};
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use metrics::counter;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use troupe_proto::{AgentError, SessionId};

/// The fences this node holds, by session; shared by its store's clones. Without a node name
/// (one node alone) nothing is checked.
#[derive(Clone, Default)]
pub struct Fencing {
    node: Option<Arc<str>>,
    // A plain mutex: held to read or change one entry, never across an await. By session:
    // (fence, the lease's expiry as last acquired or renewed).
    held: Arc<Mutex<HashMap<String, (u64, u64)>>>,
}

impl Fencing {
    pub(crate) fn new(node: Option<String>) -> Self {
        Self {
            node: node.map(Into::into),
            held: Arc::default(),
        }
    }

    fn held(&self, session_id: &str) -> Option<u64> {
        self.lock().get(session_id).map(|(fence, _)| *fence)
    }

    /// Whether this node holds the session's lease, unexpired at `now_ms` as far as its last
    /// acquisition or renewal says (no query).
    pub fn holds(&self, session_id: &str, now_ms: u64) -> bool {
        self.lock()
            .get(session_id)
            .is_some_and(|(_, until)| now_ms < *until)
    }

    /// Notes a renewal's new expiry.
    fn renewed(&self, session_id: &str, fence: u64, until: u64) {
        if let Some(h) = self.lock().get_mut(session_id)
            && h.0 == fence
        {
            h.1 = until;
        }
    }

    /// A renewal of the lease of `fence` failed: the session is forgotten, unless this node
    /// acquired it again meanwhile (a newer fence): that lease, `(fence, expiry)`, stands.
    fn renewal_failed(&self, session_id: &str, fence: u64) -> Option<(u64, u64)> {
        let mut held = self.lock();
        match held.get(session_id) {
            Some(&(current, until)) if current != fence => Some((current, until)),
            _ => {
                held.remove(session_id);
                None
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, u64)>> {
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Refuses the write (`Interrupted`, "lease lost") unless this node holds the session's
    /// current fence. Call inside the write's transaction, before it changes anything.
    pub(crate) async fn check(
        &self,
        tx: &impl GenericClient,
        session_id: &str,
    ) -> Result<(), AgentError> {
        let Some(node) = &self.node else {
            return Ok(());
        };
        let lease = row(
            tx,
            "read lease",
            "SELECT owner, fence FROM session_leases WHERE session_id = $1 FOR SHARE",
            &[&session_id],
        )
        .await?;
        let lease = lease
            .map(|r| {
                let owner: String = col(&r, 0, "read lease")?;
                let fence: i64 = col(&r, 1, "read lease")?;
                Ok::<_, AgentError>((owner, u64::try_from(fence).unwrap_or(0)))
            })
            .transpose()?;
        let held = self.held(session_id);
        match fence_verdict(node, held, lease.as_ref().map(|(o, f)| (o.as_str(), *f))) {
            FenceVerdict::Allowed => Ok(()),
            FenceVerdict::Refused(why) => {
                tracing::warn!(session_id, node = %node, %why, "write refused: lease lost");
                Err(crate::leases::lease_lost(session_id, &why))
            }
        }
    }
}

fn ms(what: &str, value: u64) -> Result<i64, AgentError> {
    crate::conn::to_sql_int(what, value)
}

impl PgStore {
    fn node_name(&self) -> Result<&str, AgentError> {
        self.fencing
            .node
            .as_deref()
            .ok_or_else(|| AgentError::invalid("this store has no node name: it takes no leases"))
    }
}

#[async_trait]
impl SessionLeases for PgStore {
    fn node(&self) -> &str {
        self.fencing.node.as_deref().unwrap_or("local")
    }

    fn holds(&self, session_id: SessionId, now_ms: u64) -> bool {
        self.fencing.holds(&session_id.to_string(), now_ms)
    }

    fn held_fences(&self) -> Vec<(SessionId, u64)> {
        let mut held: Vec<(SessionId, u64)> = self
            .fencing
            .lock()
            .iter()
            .filter_map(|(k, (f, _))| k.parse().ok().map(|s| (s, *f)))
            .collect();
        held.sort_unstable();
        held
    }

    async fn acquire(
        &self,
        session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Acquired, AgentError> {
        let node = self.node_name()?.to_owned();
        let key = session_id.to_string();
        let (now, until) = (
            ms("now_ms", now_ms)?,
            ms("expires_ms", expiry(now_ms, ttl))?,
        );
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err("begin"))?;
        // The previous owner (locked), then the lease taken if it is free, expired or ours.
        let before = row(
            &tx,
            "read lease",
            "SELECT owner, expires_ms FROM session_leases WHERE session_id = $1 FOR UPDATE",
            &[&key],
        )
        .await?
        .map(|r| {
            Ok::<_, AgentError>((
                col::<String>(&r, 0, "read lease")?,
                col::<i64>(&r, 1, "read lease")?,
            ))
        })
        .transpose()?;
        let taken = row(
            &tx,
            "acquire lease",
            "INSERT INTO session_leases (session_id, owner, fence, expires_ms) VALUES ($1, $2, 1, $4)
             ON CONFLICT (session_id) DO UPDATE
                 SET owner = $2, fence = session_leases.fence + 1, expires_ms = $4
                 WHERE session_leases.owner = $2 OR session_leases.expires_ms <= $3
             RETURNING fence",
            &[&key, &node, &now, &until],
        )
        .await?;
        let answer = match taken {
            Some(r) => {
                let fence = u64::try_from(col::<i64>(&r, 0, "acquire lease")?).unwrap_or(0);
                let from = before.map(|(owner, _)| owner).filter(|o| *o != node);
                Acquired::Granted {
                    lease: Lease {
                        fence,
                        expires_ms: expiry(now_ms, ttl),
                    },
                    from,
                }
            }
            None => {
                let (owner, expires_ms) = before.unwrap_or_default();
                Acquired::Held {
                    owner,
                    expires_ms: u64::try_from(expires_ms).unwrap_or(0),
                }
            }
        };
        tx.commit().await.map_err(pg_err("commit"))?;
        match &answer {
            Acquired::Granted { lease, from } => {
                self.fencing
                    .lock()
                    .insert(key, (lease.fence, lease.expires_ms));
                counter!(crate::leases::ACQUISITIONS, "outcome" => "granted").increment(1);
                if let Some(from) = from {
                    counter!(crate::leases::TAKEOVERS).increment(1);
                    tracing::warn!(%session_id, node = %node, from = %from, fence = lease.fence, "session lease taken over");
                } else {
                    tracing::debug!(%session_id, node = %node, fence = lease.fence, "session lease acquired");
                }
            }
            Acquired::Held { owner, .. } => {
                counter!(crate::leases::ACQUISITIONS, "outcome" => "held").increment(1);
                tracing::debug!(%session_id, node = %node, %owner, "session lease held elsewhere");
            }
        }
        Ok(answer)
    }

    async fn renew(
        &self,
        session_id: SessionId,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<Lease, AgentError> {
        let node = self.node_name()?.to_owned();
        let key = session_id.to_string();
        let lost = |why: &str| {
            counter!(crate::leases::RENEWALS, "outcome" => "lost").increment(1);
            tracing::warn!(%session_id, node = %node, why, "session lease lost");
            AgentError::Interrupted {
                reason: format!("lease lost: session {session_id}: {why}"),
            }
        };
        let Some(fence) = self.fencing.held(&key) else {
            return Err(lost("this node holds no lease for it"));
        };
        let until = ms("expires_ms", expiry(now_ms, ttl))?;
        let fence_col = i64::try_from(fence).unwrap_or(i64::MAX);
        let client = self.lease_client().await?;
        let n = exec(
            &client,
            "renew lease",
            "UPDATE session_leases SET expires_ms = $4
             WHERE session_id = $1 AND owner = $2 AND fence = $3",
            &[&key, &node, &fence_col, &until],
        )
        .await?;
        if n == 0 {
            if let Some((fence, expires_ms)) = self.fencing.renewal_failed(&key, fence) {
                // Acquired again while this renewal ran: the newer lease is held.
                return Ok(Lease { fence, expires_ms });
            }
            return Err(lost("another node took it over"));
        }
        counter!(crate::leases::RENEWALS, "outcome" => "renewed").increment(1);
        self.fencing.renewed(&key, fence, expiry(now_ms, ttl));
        Ok(Lease {
            fence,
            expires_ms: expiry(now_ms, ttl),
        })
    }

    async fn renew_many(
        &self,
        sessions: &[SessionId],
        now_ms: u64,
        ttl: Duration,
    ) -> Vec<(SessionId, Result<Lease, AgentError>)> {
        let node = match self.node_name() {
            Ok(n) => n.to_owned(),
            Err(e) => return sessions.iter().map(|s| (*s, Err(e.clone()))).collect(),
        };
        let lost = |session_id: SessionId, why: &str| {
            counter!(crate::leases::RENEWALS, "outcome" => "lost").increment(1);
            tracing::warn!(%session_id, node = %node, why, "session lease lost");
            AgentError::Interrupted {
                reason: format!("lease lost: session {session_id}: {why}"),
            }
        };
        let mut out = Vec::with_capacity(sessions.len());
        let mut keys = Vec::new();
        let mut fences = Vec::new();
        let mut held = Vec::new();
        for &session_id in sessions {
            let key = session_id.to_string();
            match self.fencing.held(&key) {
                Some(fence) => {
                    keys.push(key);
                    fences.push(i64::try_from(fence).unwrap_or(i64::MAX));
                    held.push((session_id, fence));
                }
                None => out.push((
                    session_id,
                    Err(lost(session_id, "this node holds no lease for it")),
                )),
            }
        }
        if held.is_empty() {
            return out;
        }
        let result = async {
            let until = ms("expires_ms", expiry(now_ms, ttl))?;
            let client = self.lease_client().await?;
            let renewed = rows(
                &client,
                "renew leases",
                "UPDATE session_leases l SET expires_ms = $3
                 FROM unnest($1::text[], $2::bigint[]) AS r(session_id, fence)
                 WHERE l.session_id = r.session_id AND l.fence = r.fence AND l.owner = $4
                 RETURNING l.session_id",
                &[&keys, &fences, &until, &node],
            )
            .await?;
            renewed
                .iter()
                .map(|r| col::<String>(r, 0, "renew leases"))
                .collect::<Result<std::collections::HashSet<String>, _>>()
        }
        .await;
        match result {
            Ok(renewed) => {
                for (session_id, fence) in held {
                    let key = session_id.to_string();
                    if renewed.contains(&key) {
                        counter!(crate::leases::RENEWALS, "outcome" => "renewed").increment(1);
                        self.fencing.renewed(&key, fence, expiry(now_ms, ttl));
                        out.push((
                            session_id,
                            Ok(Lease {
                                fence,
                                expires_ms: expiry(now_ms, ttl),
                            }),
                        ));
                    } else if let Some((fence, expires_ms)) =
                        self.fencing.renewal_failed(&key, fence)
                    {
                        // Acquired again while this renewal ran: the newer lease is held.
                        out.push((session_id, Ok(Lease { fence, expires_ms })));
                    } else {
                        out.push((
                            session_id,
                            Err(lost(session_id, "another node took it over")),
                        ));
                    }
                }
            }
            Err(e) => out.extend(held.into_iter().map(|(s, _)| (s, Err(e.clone())))),
        }
        out
    }

    async fn publish_api(&self, api_url: &str, now_ms: u64) -> Result<(), AgentError> {
        let node = self.node_name()?.to_owned();
        let now = ms("now_ms", now_ms)?;
        let client = self.lease_client().await?;
        exec(
            &client,
            "publish node",
            "INSERT INTO cluster_nodes (node, api_url, heartbeat_ms) VALUES ($1, $2, $3)
             ON CONFLICT (node) DO UPDATE SET api_url = $2, heartbeat_ms = $3",
            &[&node, &api_url, &now],
        )
        .await
        .map(drop)
    }

    async fn not_held_elsewhere(
        &self,
        sessions: Vec<SessionId>,
        now_ms: u64,
    ) -> Result<Vec<SessionId>, AgentError> {
        if sessions.is_empty() {
            return Ok(sessions);
        }
        let node = self.node_name()?.to_owned();
        let now = ms("now_ms", now_ms)?;
        let keys: Vec<String> = sessions.iter().map(ToString::to_string).collect();
        let client = self.client().await?;
        let held: std::collections::HashSet<String> = rows(
            &client,
            "leases held elsewhere",
            "SELECT session_id FROM session_leases
             WHERE session_id = ANY($1::text[]) AND expires_ms > $2 AND owner <> $3",
            &[&keys, &now, &node],
        )
        .await?
        .iter()
        .map(|r| col::<String>(r, 0, "leases held elsewhere"))
        .collect::<Result<_, _>>()?;
        Ok(sessions
            .into_iter()
            .filter(|s| !held.contains(&s.to_string()))
            .collect())
    }

    async fn least_loaded(
        &self,
        now_ms: u64,
        alive_after_ms: u64,
    ) -> Result<Option<(String, String)>, AgentError> {
        let (now, alive) = (ms("now_ms", now_ms)?, ms("alive_after_ms", alive_after_ms)?);
        let client = self.client().await?;
        row(
            &client,
            "least loaded node",
            "SELECT n.node, n.api_url FROM cluster_nodes n
             LEFT JOIN session_leases l ON l.owner = n.node AND l.expires_ms > $1
             WHERE n.heartbeat_ms > $2
             GROUP BY n.node, n.api_url
             ORDER BY count(l.session_id), random()
             LIMIT 1",
            &[&now, &alive],
        )
        .await?
        .map(|r| {
            Ok::<_, AgentError>((
                col::<String>(&r, 0, "least loaded node")?,
                col::<String>(&r, 1, "least loaded node")?,
            ))
        })
        .transpose()
    }

    async fn owner_of(
        &self,
        session_id: SessionId,
        now_ms: u64,
    ) -> Result<Option<(String, Option<String>)>, AgentError> {
        let key = session_id.to_string();
        let now = ms("now_ms", now_ms)?;
        let client = self.client().await?;
        row(
            &client,
            "read owner",
            "SELECT l.owner, n.api_url FROM session_leases l
             LEFT JOIN cluster_nodes n ON n.node = l.owner
             WHERE l.session_id = $1 AND l.expires_ms > $2",
            &[&key, &now],
        )
        .await?
        .map(|r| {
            Ok::<_, AgentError>((
                col::<String>(&r, 0, "read owner")?,
                col::<Option<String>>(&r, 1, "read owner")?,
            ))
        })
        .transpose()
    }

    async fn release(&self, session_id: SessionId) -> Result<(), AgentError> {
        let key = session_id.to_string();
        let Some((fence, _)) = self.fencing.lock().remove(&key) else {
            return Ok(());
        };
        self.expire(&key, fence).await
    }

    async fn release_fence(&self, session_id: SessionId, fence: u64) -> Result<(), AgentError> {
        let key = session_id.to_string();
        {
            let mut held = self.fencing.lock();
            if held.get(&key).is_some_and(|(current, _)| *current == fence) {
                held.remove(&key);
            }
        }
        self.expire(&key, fence).await
    }
}

impl PgStore {
    /// Expires the lease of `fence` (only that one: a newer fence of the session is left).
    async fn expire(&self, key: &str, fence: u64) -> Result<(), AgentError> {
        let node = self.node_name()?.to_owned();
        let fence = i64::try_from(fence).unwrap_or(i64::MAX);
        let client = self.client().await?;
        // Expired, not deleted: the fence must never start again from 1.
        exec(
            &client,
            "release lease",
            "UPDATE session_leases SET expires_ms = 0
             WHERE session_id = $1 AND owner = $2 AND fence = $3",
            &[&key, &node, &fence],
        )
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::Fencing;

    #[test]
    fn a_failed_renewal_forgets_only_the_lease_it_renewed() {
        let fencing = Fencing::new(Some("a".into()));
        fencing.lock().insert("s".into(), (3, 1_000));
        // The lease of fence 3 is gone: forgotten.
        assert_eq!(fencing.renewal_failed("s", 3), None);
        assert_eq!(fencing.held("s"), None);
        // Acquired again (fence 5) while a renewal of fence 4 ran: fence 5 stands.
        fencing.lock().insert("s".into(), (5, 2_000));
        assert_eq!(fencing.renewal_failed("s", 4), Some((5, 2_000)));
        assert_eq!(fencing.held("s"), Some(5));
        // Nothing held: nothing to keep.
        assert_eq!(fencing.renewal_failed("t", 1), None);
    }
}
