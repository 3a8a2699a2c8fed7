//! Helm's kind order: the order of kinds inside one layer on install and on uninstall.
//!
//! The install list is the one werf documents (seed 003) with the kinds Helm added since
//! (PriorityClass first, IngressClass, the webhook configurations last). Kinds not in the list
//! come after every listed kind, alphabetically; resources of the same kind keep their order.

use std::cmp::Ordering;

/// The install order of kinds.
pub const INSTALL_ORDER: [&str; 38] = [
    "PriorityClass",
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
];

/// The uninstall order of kinds, as Helm deletes them: webhooks first so they cannot block the
/// deletion of anything else, workloads before what they use, namespaces last.
pub const UNINSTALL_ORDER: [&str; 38] = [
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "Ingress",
    "IngressClass",
    "Service",
    "CronJob",
    "Job",
    "StatefulSet",
    "HorizontalPodAutoscaler",
    "Deployment",
    "ReplicaSet",
    "ReplicationController",
    "Pod",
    "DaemonSet",
    "RoleBindingList",
    "RoleBinding",
    "RoleList",
    "Role",
    "ClusterRoleBindingList",
    "ClusterRoleBinding",
    "ClusterRoleList",
    "ClusterRole",
    "CustomResourceDefinition",
    "PersistentVolumeClaim",
    "PersistentVolume",
    "StorageClass",
    "ConfigMap",
    "SecretList",
    "Secret",
    "ServiceAccount",
    "PodDisruptionBudget",
    "PodSecurityPolicy",
    "LimitRange",
    "ResourceQuota",
    "NetworkPolicy",
    "Namespace",
    "PriorityClass",
];

/// Which of the two orders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Install,
    Uninstall,
}

fn rank(kind: &str, direction: Direction) -> Option<usize> {
    let list: &[&str] = match direction {
        Direction::Install => &INSTALL_ORDER,
        Direction::Uninstall => &UNINSTALL_ORDER,
    };
    list.iter().position(|k| *k == kind)
}

/// A sort key with the order of [`compare`], cheap to compare: the place in the list (unlisted
/// kinds after every listed one), then the kind's name for unlisted kinds.
pub fn sort_key(kind: &str, direction: Direction) -> (usize, &str) {
    match rank(kind, direction) {
        Some(at) => (at, ""),
        None => (INSTALL_ORDER.len(), kind),
    }
}

/// Compares two kinds: listed kinds by their place in the list, unlisted ones after them,
/// alphabetically. Equal kinds compare equal, so a stable sort keeps their order.
pub fn compare(a: &str, b: &str, direction: Direction) -> Ordering {
    match (rank(a, direction), rank(b, direction)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_list_is_kept_in_order() {
        // Seed 003's list, in its order.
        let seed = [
            "Namespace",
            "NetworkPolicy",
            "ResourceQuota",
            "LimitRange",
            "PodSecurityPolicy",
            "PodDisruptionBudget",
            "ServiceAccount",
            "Secret",
            "SecretList",
            "ConfigMap",
            "StorageClass",
            "PersistentVolume",
            "PersistentVolumeClaim",
            "CustomResourceDefinition",
            "ClusterRole",
            "ClusterRoleList",
            "ClusterRoleBinding",
            "ClusterRoleBindingList",
            "Role",
            "RoleList",
            "RoleBinding",
            "RoleBindingList",
            "Service",
            "DaemonSet",
            "Pod",
            "ReplicationController",
            "ReplicaSet",
            "Deployment",
            "HorizontalPodAutoscaler",
            "StatefulSet",
            "Job",
            "CronJob",
            "Ingress",
            "APIService",
        ];
        for pair in seed.windows(2) {
            assert_eq!(
                compare(pair[0], pair[1], Direction::Install),
                Ordering::Less,
                "{pair:?}"
            );
        }
    }

    #[test]
    fn sort_keys_agree_with_compare() {
        let kinds = [
            "Widget",
            "Alpha",
            "Deployment",
            "Namespace",
            "Service",
            "Gadget",
        ];
        for direction in [Direction::Install, Direction::Uninstall] {
            for a in kinds {
                for b in kinds {
                    assert_eq!(
                        sort_key(a, direction).cmp(&sort_key(b, direction)),
                        compare(a, b, direction),
                        "{a} {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn unknown_kinds_go_last_alphabetically() {
        assert_eq!(
            compare("Widget", "APIService", Direction::Install),
            Ordering::Greater
        );
        assert_eq!(compare("Alpha", "Beta", Direction::Install), Ordering::Less);
        assert_eq!(
            compare("Widget", "Namespace", Direction::Uninstall),
            Ordering::Greater
        );
    }

    #[test]
    fn both_lists_hold_the_same_kinds() {
        let mut install = INSTALL_ORDER.to_vec();
        let mut uninstall = UNINSTALL_ORDER.to_vec();
        install.sort_unstable();
        uninstall.sort_unstable();
        assert_eq!(install, uninstall);
    }
}
