package audit

import (
	"encoding/hex"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/services/audit/internal/store"
)

func fieldErr(field, format string, args ...any) error { return fielderr.New(field, format, args...) }

func hexHash(h [32]byte) string { return hex.EncodeToString(h[:]) }

func entryToProto(e store.Entry) *auditv1.Record {
	out := auditpb.RecordToProto(e.Record)
	out.PrevHash, out.Hash = hexHash(e.PrevHash), hexHash(e.Hash)
	return out
}
