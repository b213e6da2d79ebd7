package auth

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// ringfenceMethodDescs lists every RPC of every Ringfence service, public and internal, linked
// into this binary; the generated packages register their descriptors when rules.go imports
// them.
func ringfenceMethodDescs(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	var methods []protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		if !strings.HasPrefix(string(fd.Package()), "ringfence.") {
			return true
		}
		for i := 0; i < fd.Services().Len(); i++ {
			svc := fd.Services().Get(i)
			for j := 0; j < svc.Methods().Len(); j++ {
				methods = append(methods, svc.Methods().Get(j))
			}
		}
		return true
	})
	require.NotEmpty(t, methods)
	return methods
}

// fullMethod is an RPC's gRPC name, /package.Service/Method.
func fullMethod(md protoreflect.MethodDescriptor) string {
	return "/" + string(md.Parent().FullName()) + "/" + string(md.Name())
}

// ringfenceMethods is ringfenceMethodDescs by gRPC name.
func ringfenceMethods(t *testing.T) []string {
	var methods []string
	for _, md := range ringfenceMethodDescs(t) {
		methods = append(methods, fullMethod(md))
	}
	return methods
}

func TestEveryRPCHasARule(t *testing.T) {
	for _, m := range ringfenceMethods(t) {
		_, ok := Rules[m]
		require.True(t, ok, "RPC %s has no entry in auth.Rules: add one (a permission, or internal with its allowlist)", m)
	}
}

func TestEveryRuleNamesAnRPC(t *testing.T) {
	known := make(map[string]bool)
	for _, m := range ringfenceMethods(t) {
		known[m] = true
	}
	for m, r := range Rules {
		if r.Public {
			continue
		}
		require.True(t, known[m], "auth.Rules has an entry for %s, which no service defines", m)
	}
}

func TestEachRuleSetsExactlyOneField(t *testing.T) {
	for m, r := range Rules {
		n := 0
		if r.Permission != "" {
			n++
		}
		if len(r.Internal) > 0 {
			n++
		}
		if r.Public {
			n++
		}
		require.Equal(t, 1, n, "rule for %s", m)
	}
}

// TestOnlyAnUnboundAdminBacksUp: a backup copies every tenant's data and the sealed secrets, so
// among the built-in roles only admin holds backup, and its rule refuses a key bound to a
// tenant whatever its role.
func TestOnlyAnUnboundAdminBacksUp(t *testing.T) {
	for name, perms := range BuiltinRoles {
		require.Equal(t, name == RoleAdmin, Role{Permissions: perms}.Has(Backup), "role %s", name)
	}
	var backups []string
	for m, r := range Rules {
		if r.Permission == Backup {
			backups = append(backups, m)
			require.True(t, r.Deployment, "%s must refuse a key bound to a tenant", m)
		}
	}
	require.Equal(t, []string{"/ringfence.admin.v1.AdminService/Backup"}, backups)
}
