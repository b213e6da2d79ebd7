package auth

import (
	"slices"

	"google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	poolinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/pool/v1"
	publisherinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/publisher/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	publisherv1 "github.com/ringfence/ringfence/gen/go/ringfence/publisher/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/mtls"
)

// Rule says who may call one RPC. Exactly one of Permission, Internal and Public is set.
type Rule struct {
	// Permission an API key's role must hold.
	Permission Permission
	// Internal lists the service identities whose certificates may call; API keys never can.
	Internal []string
	// Public marks health checks and reflection, which every client may use.
	Public bool
	// Deployment marks RPCs over state every tenant shares (registrations, their secrets and
	// grants): a key bound to one tenant may not call them, whatever its role.
	Deployment bool
	// AllTenants marks RPCs whose tenant narrows rather than chooses: a caller bound to no
	// tenant that names none spans every tenant (Tenancy.All) instead of acting for
	// DefaultTenant. Audit reads filter by tenant; CreateKey's tenant is the new key's binding.
	AllTenants bool
}

func (r Rule) allows(service string) bool { return slices.Contains(r.Internal, service) }

func perm(p Permission) Rule       { return Rule{Permission: p} }
func deployment(p Permission) Rule { return Rule{Permission: p, Deployment: true} }
func internal(svcs ...string) Rule { return Rule{Internal: svcs} }

// anyTenant is p where naming no tenant means every tenant (Rule.AllTenants).
func anyTenant(p Permission) Rule { return Rule{Permission: p, AllTenants: true} }

var public = Rule{Public: true}

// Rules is the one table of every RPC's permission. A test fails when a method of any service
// is missing here, and a matrix test calls every RPC with every built-in role.
var Rules = map[string]Rule{
	// Registry: admin-tier, because grants are the ceiling authors cannot edit; and
	// deployment-wide, because every tenant's graphs run against the same registrations.
	registryv1.RegistryService_CreateServer_FullMethodName:    deployment(MCPAdmin),
	registryv1.RegistryService_GetServer_FullMethodName:       deployment(MCPAdmin),
	registryv1.RegistryService_ListServers_FullMethodName:     deployment(MCPAdmin),
	registryv1.RegistryService_UpdateServer_FullMethodName:    deployment(MCPAdmin),
	registryv1.RegistryService_DeleteServer_FullMethodName:    deployment(MCPAdmin),
	registryv1.RegistryService_ListServerTools_FullMethodName: deployment(MCPAdmin),
	registryv1.RegistryService_ExploreServer_FullMethodName:   deployment(MCPAdmin),
	registryv1.RegistryService_PutSecret_FullMethodName:       deployment(MCPAdmin),
	registryv1.RegistryService_ListSecrets_FullMethodName:     deployment(MCPAdmin),
	registryv1.RegistryService_DeleteSecret_FullMethodName:    deployment(MCPAdmin),

	registryv1.KeyService_CreateKey_FullMethodName: anyTenant(KeysAdmin),
	registryv1.KeyService_ListKeys_FullMethodName:  perm(KeysAdmin),
	registryv1.KeyService_RevokeKey_FullMethodName: perm(KeysAdmin),
	registryv1.KeyService_ListRoles_FullMethodName: perm(KeysAdmin),

	// Publisher: authors draft, import and publish; deleting a graph is administration.
	publisherv1.PublisherService_CreateGraph_FullMethodName:   perm(WorkflowWrite),
	publisherv1.PublisherService_GetDraft_FullMethodName:      perm(WorkflowWrite),
	publisherv1.PublisherService_ReplaceDraft_FullMethodName:  perm(WorkflowWrite),
	publisherv1.PublisherService_ValidateDraft_FullMethodName: perm(WorkflowWrite),
	publisherv1.PublisherService_Publish_FullMethodName:       perm(WorkflowWrite),
	publisherv1.PublisherService_GetVersion_FullMethodName:    perm(WorkflowWrite),
	publisherv1.PublisherService_ListVersions_FullMethodName:  perm(WorkflowWrite),
	publisherv1.PublisherService_ListGraphs_FullMethodName:    perm(WorkflowWrite),
	publisherv1.PublisherService_ImportTools_FullMethodName:   perm(WorkflowWrite),
	publisherv1.PublisherService_DeleteGraph_FullMethodName:   perm(WorkflowAdmin),

	// Pool: runs.
	poolv1.PoolService_StartRun_FullMethodName:  perm(RunExecute),
	poolv1.PoolService_CallTool_FullMethodName:  perm(RunExecute),
	poolv1.PoolService_PauseRun_FullMethodName:  perm(RunExecute),
	poolv1.PoolService_ResumeRun_FullMethodName: perm(RunExecute),
	poolv1.PoolService_EndRun_FullMethodName:    perm(RunExecute),
	poolv1.PoolService_GetRun_FullMethodName:    perm(RunExecute),
	// Listing an agent's tools is part of running it (a platform asks before each turn).
	poolv1.PoolService_ListAgentTools_FullMethodName: perm(RunExecute),
	// Deciding a call that asks a person first is the approver's, never the runner's: the
	// approver reads the call's arguments (ListApprovals) to decide on them.
	poolv1.PoolService_ListApprovals_FullMethodName: perm(RunApprove),
	poolv1.PoolService_ApproveCall_FullMethodName:   perm(RunApprove),
	poolv1.PoolService_DenyCall_FullMethodName:      perm(RunApprove),
	// Documents are what a run's calls are given: whoever runs agents uploads them.
	poolv1.PoolService_PutDocument_FullMethodName:    perm(RunExecute),
	poolv1.PoolService_GetDocument_FullMethodName:    perm(RunExecute),
	poolv1.PoolService_DeleteDocument_FullMethodName: perm(RunExecute),
	// An agent token lets an MCP client do what its minter may do with one agent of one run
	// (list and call its tools): whoever runs agents connects them.
	poolv1.PoolService_CreateAgentToken_FullMethodName: perm(RunExecute),
	poolv1.PoolService_ConnectServer_FullMethodName:    perm(RunExecute),
	poolv1.PoolService_ListAgentTokens_FullMethodName:  perm(RunExecute),
	poolv1.PoolService_RevokeAgentToken_FullMethodName: perm(RunExecute),

	// Audit: readers need audit:read (producers append on the internal plane, below).
	auditv1.AuditService_List_FullMethodName:   anyTenant(AuditRead),
	auditv1.AuditService_Watch_FullMethodName:  anyTenant(AuditRead),
	auditv1.AuditService_Verify_FullMethodName: perm(AuditRead),
	auditv1.AuditService_Export_FullMethodName: anyTenant(AuditRead),

	// Admin: a backup copies every tenant's data and the sealed secrets, so a key bound to a
	// tenant may not take one, whatever its role.
	adminv1.AdminService_Backup_FullMethodName: deployment(Backup),

	// The internal plane (ringfence.internal.*), served only on each split binary's internal
	// listener, which accepts nothing but mutual TLS. Each RPC names the service certificates
	// that may call it; API keys never can.
	registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName:         internal(mtls.Pool),
	registryinternalv1.RegistryInternalService_GetServerPolicy_FullMethodName:       internal(mtls.Publisher, mtls.Pool),
	registryinternalv1.RegistryInternalService_AuthenticateKey_FullMethodName:       internal(mtls.Publisher, mtls.Pool, mtls.Audit),
	registryinternalv1.RegistryInternalService_ListWarmTargets_FullMethodName:       internal(mtls.Pool),
	publisherinternalv1.PublisherInternalService_GetPublishedVersion_FullMethodName: internal(mtls.Pool),
	// Discovery starts servers, so only the control plane's certificates may ask.
	poolinternalv1.PoolInternalService_Discover_FullMethodName: internal(mtls.Registry, mtls.Publisher),
	// The registry shows the pool's warm containers in GetServer and ListServers.
	poolinternalv1.PoolInternalService_GetWarmStatus_FullMethodName: internal(mtls.Registry),
	// A pool host forwards a request about a run to the host that owns it.
	poolinternalv1.PoolInternalService_ForwardRun_FullMethodName: internal(mtls.Pool),
	// A pool host forwards its MCP front door's calls the same way, streaming progress back.
	poolinternalv1.PoolInternalService_ForwardCallTool_FullMethodName: internal(mtls.Pool),
	// A pool host whose front door serves sessions of another host's run watches its listings.
	poolinternalv1.PoolInternalService_WatchAgentTools_FullMethodName: internal(mtls.Pool),
	auditinternalv1.AuditInternalService_Append_FullMethodName:        internal(mtls.Registry, mtls.Publisher, mtls.Pool),

	grpc_health_v1.Health_Check_FullMethodName:                             public,
	grpc_health_v1.Health_Watch_FullMethodName:                             public,
	grpc_health_v1.Health_List_FullMethodName:                              public,
	reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName:      public,
	reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName: public,
}
