package registry

import (
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/registry/internal/store"
)

// SecretMask replaces every env value in every response.
const SecretMask = mcpserver.SecretMask

// serverSpec is what CreateServerRequest and UpdateServerRequest have in common.
type serverSpec interface {
	GetRef() string
	GetDescription() string
	GetTransport() string
	GetCommand() string
	GetArgs() []string
	GetEnv() *structpb.Struct
	GetUrl() string
	GetHeaders() map[string]string
	GetGrants() []string
	GetToolFilter() *registryv1.ToolFilter
	GetToolPermissions() map[string]*registryv1.ToolPermissions
	GetClientSessionTimeout() *durationpb.Duration
	GetToolCallTimeout() *durationpb.Duration
	GetKeepMarkup() bool
	GetStrictInputs() bool
	GetPrewarm() int32
	GetMaxResultBytes() int64
	GetOauth() *registryv1.OAuthSignIn
}

// registrationFromProto converts and validates a request. It reports whether env was present,
// because an update without env keeps the stored one.
func registrationFromProto(req serverSpec, allowedEnvKeys []string) (*mcpserver.Registration, bool, error) {
	reg := &mcpserver.Registration{
		Ref:         req.GetRef(),
		Description: req.GetDescription(),
		Transport:   req.GetTransport(),
		Command:     req.GetCommand(),
		Args:        req.GetArgs(),
		URL:         req.GetUrl(),
		Headers:     req.GetHeaders(),
		Grants:      req.GetGrants(),
		Filter: mcpserver.ToolFilter{
			Include: req.GetToolFilter().GetInclude(),
			Exclude: req.GetToolFilter().GetExclude(),
		},
		KeepMarkup:     req.GetKeepMarkup(),
		StrictInputs:   req.GetStrictInputs(),
		MaxResultBytes: req.GetMaxResultBytes(),
		Prewarm:        int(req.GetPrewarm()),
	}
	if o := req.GetOauth(); o != nil {
		reg.OAuth = &mcpserver.OAuth{
			AuthorizationServer: o.GetAuthorizationServer(), ClientID: o.GetClientId(),
			ClientSecretRef: o.GetClientSecretRef(), Scopes: o.GetScopes(),
		}
	}
	if perms := req.GetToolPermissions(); len(perms) > 0 {
		reg.ToolPermissions = make(map[string][]string, len(perms))
		for tool, p := range perms {
			reg.ToolPermissions[tool] = p.GetRequired()
		}
	}
	var err error
	if reg.ClientSessionTimeout, err = durationFromProto("client_session_timeout", req.GetClientSessionTimeout()); err != nil {
		return nil, false, err
	}
	if reg.ToolCallTimeout, err = durationFromProto("tool_call_timeout", req.GetToolCallTimeout()); err != nil {
		return nil, false, err
	}
	envPresent := req.GetEnv() != nil
	if envPresent {
		reg.Env = make(map[string]string, len(req.GetEnv().GetFields()))
		for k, v := range req.GetEnv().GetFields() {
			sv, ok := v.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return nil, false, fielderr.New("env."+k, "must be a string; every env value is a string, e.g. \"8080\"")
			}
			reg.Env[k] = sv.StringValue
		}
	}
	if err := reg.Validate(allowedEnvKeys); err != nil {
		return nil, false, err
	}
	return reg, envPresent, nil
}

func durationFromProto(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, fielderr.New(field, "is not a valid duration")
	}
	return d.AsDuration(), nil
}

func durationToProto(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

// serverToProto renders a registration for any response: env values masked, and the URL's
// query values (mcpserver.MaskURL).
func serverToProto(r *mcpserver.Registration) *registryv1.Server {
	out := &registryv1.Server{
		Ref:                  r.Ref,
		Description:          r.Description,
		Transport:            r.Transport,
		Command:              r.Command,
		Args:                 r.Args,
		Env:                  make(map[string]string, len(r.Env)),
		Url:                  mcpserver.MaskURL(r.URL),
		Headers:              r.Headers,
		Grants:               r.Grants,
		ToolFilter:           &registryv1.ToolFilter{Include: r.Filter.Include, Exclude: r.Filter.Exclude},
		ClientSessionTimeout: durationToProto(r.ClientSessionTimeout),
		ToolCallTimeout:      durationToProto(r.ToolCallTimeout),
		KeepMarkup:           r.KeepMarkup,
		StrictInputs:         r.StrictInputs,
		Prewarm:              int32(r.Prewarm),
		MaxResultBytes:       r.MaxResultBytes,
		Revision:             r.Revision,
		CreateTime:           timestamppb.New(r.CreateTime),
		UpdateTime:           timestamppb.New(r.UpdateTime),
	}
	for k := range r.Env {
		out.Env[k] = SecretMask
	}
	if o := r.OAuth; o != nil {
		out.Oauth = &registryv1.OAuthSignIn{
			AuthorizationServer: o.AuthorizationServer, ClientId: o.ClientID,
			ClientSecretRef: o.ClientSecretRef, Scopes: o.Scopes,
		}
	}
	if len(r.ToolPermissions) > 0 {
		out.ToolPermissions = make(map[string]*registryv1.ToolPermissions, len(r.ToolPermissions))
		for tool, reqs := range r.ToolPermissions {
			out.ToolPermissions[tool] = &registryv1.ToolPermissions{Required: reqs}
		}
	}
	return out
}

func secretToProto(s store.Secret) *registryv1.Secret {
	return &registryv1.Secret{Name: s.Name, UpdateTime: timestamppb.New(s.UpdateTime)}
}

func keyToProto(k store.Key) *registryv1.ApiKey {
	out := &registryv1.ApiKey{
		Id: k.ID, Name: k.Name, Role: k.Role, Tenant: k.Tenant,
		CreateTime: timestamppb.New(k.CreateTime), Revoked: k.Revoked,
	}
	if !k.LastUsed.IsZero() {
		out.LastUsedTime = timestamppb.New(k.LastUsed)
	}
	if !k.RevokeTime.IsZero() {
		out.RevokeTime = timestamppb.New(k.RevokeTime)
	}
	return out
}
