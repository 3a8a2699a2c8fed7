//! Objects without an owner: someone else's by their annotations, whose owner (a
//! SequencedRelease, or a Helm release's records) no longer exists.

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams};

use super::Objects;
use crate::api::{Claim, Owner, SequencedRelease, helm_records_selector};
use crate::controller::{Error, kube_error};
use crate::rollout::Observations;

impl Objects<'_> {
    /// Notes in `observed.gone` the owners named by the objects observed (someone else's, by
    /// their annotations) that no longer exist: no SequencedRelease of the owner annotation, and
    /// no Helm record (Secret or ConfigMap) of the Helm release the annotations name. Such an
    /// object has no owner (an orphan): the lifecycle takes it over by the rules of
    /// `crate::rollout::install`.
    pub(super) async fn orphans(&self, observed: &mut Observations) -> Result<(), Error> {
        let claims: Vec<Claim> = observed
            .resources
            .values()
            .chain(observed.crds.values())
            .flatten()
            .map(Claim::of)
            .collect();
        for claim in claims {
            let Owner::Other(other) = claim.judge(self.me) else {
                continue;
            };
            if observed.gone.contains(&other) || observed.alive.contains(&other) {
                continue;
            }
            if self.owner_gone(&claim).await? {
                observed.gone.insert(other);
            } else {
                observed.alive.insert(other);
            }
        }
        Ok(())
    }

    /// Whether every owner `claim` names is gone (see [`Objects::orphans`]).
    async fn owner_gone(&self, claim: &Claim) -> Result<bool, Error> {
        if let Some(owner) = &claim.owner {
            let Some((namespace, name)) = owner.split_once('/') else {
                return Ok(false);
            };
            let releases: Api<SequencedRelease> =
                Api::namespaced(self.ctx.client.clone(), namespace);
            let found = releases
                .get_metadata_opt(name)
                .await
                .map_err(kube_error(format!("reading SequencedRelease {owner}")))?;
            if found.is_some() {
                return Ok(false);
            }
        }
        let Some(name) = &claim.release_name else {
            return Ok(claim.owner.is_some());
        };
        // A Helm release named without its namespace cannot be looked for: not gone.
        let Some(namespace) = &claim.release_namespace else {
            return Ok(false);
        };
        let selector = helm_records_selector(name);
        let params = ListParams::default().labels(&selector).limit(1);
        let what = format!("looking for the records of Helm release {name} in {namespace}");
        let secrets: Api<Secret> = Api::namespaced(self.books.client().clone(), namespace);
        if !secrets
            .list_metadata(&params)
            .await
            .map_err(kube_error(what.clone()))?
            .items
            .is_empty()
        {
            return Ok(false);
        }
        let maps: Api<ConfigMap> = Api::namespaced(self.books.client().clone(), namespace);
        Ok(maps
            .list_metadata(&params)
            .await
            .map_err(kube_error(what))?
            .items
            .is_empty())
    }
}
