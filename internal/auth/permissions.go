// Package auth decides who may call which RPC: API keys carry a role, roles carry permissions,
// and internal RPCs are reserved for the service certificates on their allowlist. Every RPC of
// every service has exactly one rule in Rules; a method without one is refused.
package auth

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Permission is one thing a key may do.
type Permission string

// The permissions. mcp:admin is admin-tier: it decides what registered servers may be asked
// for, so the operator role, which authors graphs, deliberately lacks it. run:approve decides
// the calls that ask a person first, so the runner role, which makes them, lacks it. backup
// copies the data files whole (every tenant's data, the sealed secrets), so only admin holds it
// among the built-in roles, and only with a key bound to no tenant (its rule is deployment-wide).
const (
	MCPAdmin       Permission = "mcp:admin"
	WorkflowAdmin  Permission = "workflow:admin"
	WorkflowWrite  Permission = "workflow:write"
	ConnectorAdmin Permission = "connector:admin"
	RunExecute     Permission = "run:execute"
	RunApprove     Permission = "run:approve"
	AuditRead      Permission = "audit:read"
	KeysAdmin      Permission = "keys:admin"
	Backup         Permission = "backup"
)

// AllPermissions lists every permission in a stable order.
var AllPermissions = []Permission{MCPAdmin, WorkflowAdmin, WorkflowWrite, ConnectorAdmin, RunExecute, RunApprove, AuditRead, KeysAdmin, Backup}

// Built-in role names.
const (
	RoleAdmin    = "admin"
	RoleOperator = "operator"
	RoleAuthor   = "author"
	RoleRunner   = "runner"
	RoleApprover = "approver"
	RoleAuditor  = "auditor"
)

// BuiltinRoles are the roles every deployment has.
var BuiltinRoles = map[string][]Permission{
	RoleAdmin:    AllPermissions,
	RoleOperator: {WorkflowAdmin, WorkflowWrite, ConnectorAdmin, AuditRead},
	RoleAuthor:   {WorkflowWrite},
	RoleRunner:   {RunExecute},
	// An approver decides the calls of runs that wait at an approval gate, and needs nothing
	// else: a key that both makes calls and approves them would approve its own.
	RoleApprover: {RunApprove},
	RoleAuditor:  {AuditRead},
}

// BuiltinRoleNames are BuiltinRoles' names, sorted: for help texts, which list them from here
// so that none is left out.
func BuiltinRoleNames() []string { return slices.Sorted(maps.Keys(BuiltinRoles)) }

// Role is a named set of permissions.
type Role struct {
	Name        string
	Permissions []Permission
	Builtin     bool
}

// Has reports whether the role carries p.
func (r Role) Has(p Permission) bool { return slices.Contains(r.Permissions, p) }

// Warnings names what is risky about the role.
func (r Role) Warnings() []string {
	var w []string
	if r.Name == RoleAdmin {
		return nil
	}
	// Authoring graphs takes workflow:write (workflow:admin adds deleting them): either one
	// beside mcp:admin lets the author widen the grants that bound the author's own graphs.
	for _, p := range []Permission{WorkflowAdmin, WorkflowWrite} {
		if r.Has(MCPAdmin) && r.Has(p) {
			w = append(w, fmt.Sprintf("role %q pairs mcp:admin with %s: whoever authors graphs can also widen the grants that bound them, so the ceiling becomes author-editable", r.Name, p))
		}
	}
	// A call that asks a person first is made with run:execute and decided with run:approve:
	// a key holding both approves its own calls, and the confirmation asks nobody.
	if r.Has(RunExecute) && r.Has(RunApprove) {
		w = append(w, fmt.Sprintf("role %q pairs run:execute with run:approve: whoever makes the calls that ask a person first can also approve them, so confirmation asks nobody", r.Name))
	}
	return w
}

// Roles is the set of roles a deployment knows.
type Roles struct {
	byName map[string]Role
}

var roleNamePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

// NewRoles returns the built-in roles plus the custom ones in rolesJSON, a JSON object
// {"role": ["permission", ...]} (RINGFENCE_SERVICE_ROLES_JSON). Custom roles may not redefine
// built-in ones.
func NewRoles(rolesJSON string) (*Roles, error) {
	return NewRolesFrom(rolesJSON, "RINGFENCE_SERVICE_ROLES_JSON")
}

// NewRolesFrom is NewRoles for a value that came from source, which its errors name as
// "service_roles_json (source)": config.Config.Source's ZEROTH_SERVICE_ROLES_JSON, read as
// RINGFENCE_SERVICE_ROLES_JSON, say, or a flag or file.
func NewRolesFrom(rolesJSON, source string) (*Roles, error) {
	key := "service_roles_json (" + source + ")"
	rs := &Roles{byName: make(map[string]Role)}
	for name, perms := range BuiltinRoles {
		rs.byName[name] = Role{Name: name, Permissions: perms, Builtin: true}
	}
	if strings.TrimSpace(rolesJSON) == "" {
		return rs, nil
	}
	var custom map[string][]string
	if err := json.Unmarshal([]byte(rolesJSON), &custom); err != nil {
		return nil, fmt.Errorf(`auth: %s is not a JSON object of permission lists, e.g. {"deployer": ["run:execute", "audit:read"]}: %w`, key, err)
	}
	for name, perms := range custom {
		if !roleNamePattern.MatchString(name) {
			return nil, fmt.Errorf("auth: %s: role name %q must match %s", key, name, roleNamePattern)
		}
		if _, ok := BuiltinRoles[name]; ok {
			return nil, fmt.Errorf("auth: %s: role %q is built in and cannot be redefined; pick another name", key, name)
		}
		role := Role{Name: name}
		for _, p := range perms {
			if !slices.Contains(AllPermissions, Permission(p)) {
				return nil, fmt.Errorf("auth: %s: role %q: unknown permission %q (known: %s)", key, name, p, joinPerms(AllPermissions))
			}
			if !role.Has(Permission(p)) {
				role.Permissions = append(role.Permissions, Permission(p))
			}
		}
		rs.byName[name] = role
	}
	return rs, nil
}

// Lookup returns a role by name.
func (rs *Roles) Lookup(name string) (Role, bool) {
	r, ok := rs.byName[name]
	return r, ok
}

// All returns every role, built-in first, then by name.
func (rs *Roles) All() []Role {
	out := make([]Role, 0, len(rs.byName))
	for _, r := range rs.byName {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Builtin != out[j].Builtin {
			return out[i].Builtin
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// Warnings collects the warnings of every role.
func (rs *Roles) Warnings() []string {
	var w []string
	for _, r := range rs.All() {
		w = append(w, r.Warnings()...)
	}
	return w
}

func joinPerms(ps []Permission) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = string(p)
	}
	return strings.Join(s, ", ")
}
