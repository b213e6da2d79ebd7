package store

import (
	"context"
	"encoding/json"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// The clients the pool registered for itself (oauth_clients.go) in etcd, shared by every pool
// host, so that a token one host obtained refreshes on another with the same client:
//
//	oauth/clients/<sha256 of issuer and redirect URI>        the OAuthClient JSON (secret sealed)
//	oauth/client_locks/<sha256 of issuer and redirect URI>/  the lock a registration holds
const (
	etcdOAuthClients     = "clients"
	etcdOAuthClientLocks = "client_locks"
)

func (s *Etcd) oauthClientKey(kind, issuer, redirectURI string) string {
	return s.space.Key(etcdOAuth, kind, oauthClientName(issuer, redirectURI))
}

// PutOAuthClient stores the client registered at c.Issuer for c.RedirectURI, replacing the
// one before.
func (s *Etcd) PutOAuthClient(ctx context.Context, c OAuthClient) error {
	val, err := json.Marshal(c)
	if err != nil {
		return err
	}
	key := s.oauthClientKey(etcdOAuthClients, c.Issuer, c.RedirectURI)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		_, err := s.cli.Put(ctx, key, string(val))
		return err == nil, etcdstore.Unavailable("write "+key, err)
	})
}

// OAuthClient reads the client registered at issuer for redirectURI; ErrNotFound without one.
func (s *Etcd) OAuthClient(ctx context.Context, issuer, redirectURI string) (OAuthClient, error) {
	var c OAuthClient
	err := s.getJSON(ctx, s.oauthClientKey(etcdOAuthClients, issuer, redirectURI), &c)
	return c, err
}

// DropOAuthClient deletes the client registered at issuer for redirectURI when it is still
// clientID: a client another host registered since under another id stays.
func (s *Etcd) DropOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) error {
	key := s.oauthClientKey(etcdOAuthClients, issuer, redirectURI)
	return etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return false, etcdstore.Unavailable("read "+key, err)
		}
		if len(resp.Kvs) == 0 {
			return true, nil
		}
		var c OAuthClient
		if err := json.Unmarshal(resp.Kvs[0].Value, &c); err == nil && c.ClientID != clientID {
			return true, nil
		}
		// Deleted only if unchanged since read; a write meanwhile is read again.
		c2, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)},
			[]clientv3.Op{clientv3.OpDelete(key)}, nil)
		return err == nil && c2.Succeeded, err
	})
}

// LockOAuthClient holds the registration at issuer for redirectURI against every other holder
// on any pool host, until unlock is called: one host registers, the others wait and use its
// client. The lock lives on a lease of its own, as a refresh's does.
func (s *Etcd) LockOAuthClient(ctx context.Context, issuer, redirectURI string) (unlock func(), err error) {
	return s.lockOnLease(ctx, s.oauthClientKey(etcdOAuthClientLocks, issuer, redirectURI), "a client registration")
}
