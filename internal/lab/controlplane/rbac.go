package controlplane

import (
	"context"
	"fmt"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AgentClusterRole is the least privilege an axon-agent needs: read the objects it turns into
// datapath state, and report events. Nothing else (no secrets, no writes to nodes or pods).
func AgentClusterRole() *rbacv1.ClusterRole {
	read := []string{"get", "list", "watch"}
	return &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: AgentRoleName, Labels: map[string]string{"app.kubernetes.io/part-of": "axon"}},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes", "pods", "services", "namespaces"}, Verbs: read},
			{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
			{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
}

// AgentClusterRoleBinding binds AgentClusterRole to every agent identity (Group axon:agents).
func AgentClusterRoleBinding() *rbacv1.ClusterRoleBinding {
	return &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: AgentRoleName, Labels: map[string]string{"app.kubernetes.io/part-of": "axon"}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: AgentRoleName},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: AgentGroup}},
	}
}

// applyAgentRBAC creates or updates the agent ClusterRole and its binding.
func applyAgentRBAC(ctx context.Context, cs kubernetes.Interface) error {
	role := AgentClusterRole()
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := cs.RbacV1().ClusterRoles().Get(ctx, role.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get clusterrole %s: %w", role.Name, err)
		}
		cur.Rules, cur.Labels = role.Rules, role.Labels
		if _, err := cs.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update clusterrole %s: %w", role.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("create clusterrole %s: %w", role.Name, err)
	}

	b := AgentClusterRoleBinding()
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		cur, err := cs.RbacV1().ClusterRoleBindings().Get(ctx, b.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get clusterrolebinding %s: %w", b.Name, err)
		}
		if cur.RoleRef != b.RoleRef { // roleRef is immutable: replace the binding
			if err := cs.RbacV1().ClusterRoleBindings().Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
				return fmt.Errorf("replace clusterrolebinding %s: %w", b.Name, err)
			}
			if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("create clusterrolebinding %s: %w", b.Name, err)
			}
			return nil
		}
		cur.Subjects, cur.Labels = b.Subjects, b.Labels
		if _, err := cs.RbacV1().ClusterRoleBindings().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update clusterrolebinding %s: %w", b.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("create clusterrolebinding %s: %w", b.Name, err)
	}
	return nil
}
