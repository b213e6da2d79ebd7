package pool

import (
	"context"
	"fmt"

	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// moveSignIns brings the users' sign-ins a host kept in pool.db on bbolt into etcd when it
// starts on etcd (docs/oauth.md, "Moving a host to etcd"): each user's token with its listing,
// and each client the pool registered for itself, sealed as they are, each only where etcd
// holds none of its key (a sign-in made on another host since, or copied by another host,
// stands). Pending sign-ins are not copied: they expire within oauth.state_ttl, and the user
// asks again. Then pool.db's sign-ins are cleared, so the next start copies nothing and a
// move back to bbolt finds no token that etcd dropped or replaced since.
//
// Nothing is copied, and pool.db is left as it is, when this host's key is not the one the
// hosts sharing etcd seal with (shared false), or does not open every sign-in: the others
// could not open them. The error log says how to fix it; the copy is made at the first start
// after.
func (s *Service) moveSignIns(ctx context.Context, er *store.Etcd, shared bool) error {
	local, err := s.store.LocalSignIns(ctx)
	if err != nil {
		return fmt.Errorf("pool: reading the users' sign-ins in pool.db to copy them to etcd: %w", err)
	}
	for _, sk := range local.Skipped {
		s.log.Warn("an entry of pool.db's sign-ins is not copied to etcd: no pool writes one like it, so the file was damaged or altered; it goes when pool.db's sign-ins are cleared (its user signs in again)",
			"bucket", sk.Bucket, "key", sk.Key, "reason", sk.Reason)
	}
	if len(local.Tokens) == 0 && len(local.Clients) == 0 && local.Pending == 0 && len(local.Skipped) == 0 {
		return nil
	}
	if n := len(local.Tokens) + len(local.Clients); n > 0 {
		if !shared {
			s.log.Error("the users' sign-ins kept in pool.db were not copied to etcd: this host's secrets key is not the one the pool hosts sharing etcd seal with (the error above), so no other host could open them. "+
				"They stay in pool.db, unused, and are copied at the first start whose secrets key opens them and is every pool host's key; until then their users sign in again",
				"tokens", len(local.Tokens), "clients", len(local.Clients))
			return nil
		}
		if closed := s.unopened(local); closed > 0 {
			s.log.Error("the users' sign-ins kept in pool.db were not copied to etcd: some do not open with this host's secrets key (secrets_key_file was replaced since they were stored). "+
				"Give this host the key they were sealed with (every pool host sharing etcd needs that same key) and start it again; until then they stay in pool.db, unused, and their users sign in again",
				"tokens", len(local.Tokens), "clients", len(local.Clients), "not_opening", closed)
			return nil
		}
	}
	var tokensCopied, tokensInEtcd, clientsCopied, clientsInEtcd int
	for _, t := range local.Tokens {
		created, err := er.CopySignIn(ctx, t)
		if err != nil {
			return fmt.Errorf("pool: copying the users' sign-ins in pool.db to etcd (nothing is lost: the next start copies again): %w", err)
		}
		count(created, &tokensCopied, &tokensInEtcd)
	}
	for _, c := range local.Clients {
		created, err := er.CopyOAuthClient(ctx, c)
		if err != nil {
			return fmt.Errorf("pool: copying the pool's OAuth clients in pool.db to etcd (nothing is lost: the next start copies again): %w", err)
		}
		count(created, &clientsCopied, &clientsInEtcd)
	}
	if err := s.store.ClearSignIns(ctx); err != nil {
		return fmt.Errorf("pool: the users' sign-ins in pool.db are in etcd, but clearing them from pool.db failed (the next start finds them in etcd): %w", err)
	}
	s.log.Info("moved the users' sign-ins kept in pool.db to etcd, and cleared them from pool.db",
		"tokens_copied", tokensCopied, "tokens_already_in_etcd", tokensInEtcd,
		"clients_copied", clientsCopied, "clients_already_in_etcd", clientsInEtcd,
		"pending_skipped", local.Pending)
	return nil
}

// count adds one to copied or, when etcd had one already, to kept.
func count(created bool, copied, kept *int) {
	if created {
		*copied++
	} else {
		*kept++
	}
}

// unopened counts the tokens and client secrets in local that this host's secrets key does
// not open.
func (s *Service) unopened(local store.LocalSignIns) int {
	n := 0
	for _, t := range local.Tokens {
		if _, err := s.cfg.Secrets.Open(t.Sealed, tokenContext(t.Tenant, t.User, t.Ref)); err != nil {
			n++
		}
	}
	for _, c := range local.Clients {
		if len(c.SecretSealed) == 0 {
			continue
		}
		if _, err := s.cfg.Secrets.Open(c.SecretSealed, clientContext(c.Issuer, c.RedirectURI)); err != nil {
			n++
		}
	}
	return n
}
