package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// Agent tokens in etcd, beside the runs, so that every pool host's front door knows every
// token (a client may reach any host):
//
//	tokens/<tenant>/<run>/<id>    the token's record (AgentToken JSON, its hash, never itself)
//	token_hashes/<sha256>         "<tenant>/<run>/<id>" of the token with that hash
const (
	etcdTokens      = "tokens"
	etcdTokenHashes = "token_hashes"
)

func (s *Etcd) tokenKey(tenant, run, id string) string {
	return s.space.Key(etcdTokens, tenant, run, id)
}

// PutAgentToken stores a new token and its hash index; a hash already indexed is refused.
func (s *Etcd) PutAgentToken(ctx context.Context, t AgentToken) error {
	val, err := json.Marshal(t)
	if err != nil {
		return err
	}
	hashKey := s.space.Key(etcdTokenHashes, t.Hash)
	var taken bool
	err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(hashKey), "=", 0)}, []clientv3.Op{
			clientv3.OpPut(s.tokenKey(t.Tenant, t.RunID, t.ID), string(val)),
			clientv3.OpPut(hashKey, string(tokenKey(t.Tenant, t.RunID, t.ID))),
		}, nil)
		if err != nil {
			return false, err
		}
		taken = !resp.Succeeded
		return true, nil
	})
	if err == nil && taken {
		err = ErrExists
	}
	return err
}

// AgentTokenByHash finds the token whose SHA-256 is hash; ErrNotFound when none is stored.
func (s *Etcd) AgentTokenByHash(ctx context.Context, hash string) (AgentToken, error) {
	resp, err := etcdstore.Get(ctx, s.cli, "read a token's hash", s.space.Key(etcdTokenHashes, hash))
	if err != nil {
		return AgentToken{}, err
	}
	if len(resp.Kvs) == 0 {
		return AgentToken{}, ErrNotFound
	}
	var t AgentToken
	err = s.getJSON(ctx, s.space.Key(etcdTokens, string(resp.Kvs[0].Value)), &t)
	return t, err
}

// RunAgentTokens reads a run's tokens, in the order of their ids.
func (s *Etcd) RunAgentTokens(ctx context.Context, tenant, run string) ([]AgentToken, error) {
	return s.listTokens(ctx, s.space.Prefix(etcdTokens, tenant, run), func(AgentToken) bool { return true }, 0)
}

// DeleteAgentTokens removes tokens of a run by id (unknown ids are skipped) and returns those
// it removed.
func (s *Etcd) DeleteAgentTokens(ctx context.Context, tenant, run string, ids ...string) ([]AgentToken, error) {
	var gone []AgentToken
	for _, id := range ids {
		key := s.tokenKey(tenant, run, id)
		var t AgentToken
		err := s.getJSON(ctx, key, &t)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return gone, err
		}
		var deleted bool
		err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
			resp, err := etcdstore.Commit(ctx, s.cli, nil, []clientv3.Op{
				clientv3.OpDelete(key), clientv3.OpDelete(s.space.Key(etcdTokenHashes, t.Hash)),
			}, nil)
			if err != nil {
				return false, err
			}
			deleted = resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0
			return true, nil
		})
		if err != nil {
			return gone, err
		}
		if deleted { // another host may have dropped it first
			gone = append(gone, t)
		}
	}
	return gone, nil
}

// ExpiredAgentTokens lists every token that expired before now, across runs, at most limit.
func (s *Etcd) ExpiredAgentTokens(ctx context.Context, now time.Time, limit int) ([]AgentToken, error) {
	return s.listTokens(ctx, s.space.Prefix(etcdTokens), func(t AgentToken) bool { return t.ExpireTime.Before(now) }, limit)
}

// listTokens reads the tokens under prefix that keep says to, at most limit (0: all).
func (s *Etcd) listTokens(ctx context.Context, prefix string, keep func(AgentToken) bool, limit int) ([]AgentToken, error) {
	kvs, _, err := etcdstore.List(ctx, s.cli, prefix)
	if err != nil {
		return nil, etcdstore.Unavailable("list "+prefix, err)
	}
	var out []AgentToken
	for _, kv := range kvs {
		var t AgentToken
		if err := json.Unmarshal(kv.Value, &t); err != nil {
			return nil, fmt.Errorf("store: %s: %w", kv.Key, err)
		}
		if keep(t) {
			out = append(out, t)
			if limit > 0 && len(out) == limit {
				break
			}
		}
	}
	return out, nil
}
