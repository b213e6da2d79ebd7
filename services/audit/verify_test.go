package audit

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
)

// appendRuns appends one tool-call record per run, in batches.
func appendRuns(t *testing.T, svc *Service, runs ...string) {
	t.Helper()
	for start := 0; start < len(runs); start += audit.MaxBatchSize {
		var batch []*auditv1.Record
		for _, run := range runs[start:min(start+audit.MaxBatchSize, len(runs))] {
			batch = append(batch, auditpb.RecordToProto(call("acme", run)))
		}
		_, err := svc.Internal().Append(context.Background(), &auditinternalv1.AppendRequest{Records: batch})
		require.NoError(t, err)
	}
}

func runNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("r%d", i)
	}
	return out
}

// walks is how many chain walks the service's verifier has started.
func walks(svc *Service) int {
	svc.verifier.mu.Lock()
	defer svc.verifier.mu.Unlock()
	return svc.verifier.walks
}

// holdWalks makes every walk wait, once started, until the returned func is called (or the
// test ends, so a failed test does not hang in Close).
func holdWalks(t *testing.T, svc *Service) (release func()) {
	hold := make(chan struct{})
	svc.verifier.started = func() { <-hold }
	var once sync.Once
	release = func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	return release
}

// requireWaiting waits until n callers wait for the running walk.
func requireWaiting(t *testing.T, svc *Service, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		svc.verifier.mu.Lock()
		defer svc.verifier.mu.Unlock()
		return svc.verifier.running != nil && svc.verifier.running.waiters == n
	}, 10*time.Second, time.Millisecond, "%d callers wait for one walk", n)
}

func verifyAt(t *testing.T, svc *Service, anchorSeq uint64, anchorHash string) *auditv1.VerifyResponse {
	t.Helper()
	resp, err := svc.Verify(as(""), &auditv1.VerifyRequest{AnchorSeq: anchorSeq, AnchorHash: anchorHash})
	require.NoError(t, err)
	return resp
}

// TestConcurrentVerifiesAtOneHeadWalkTheChainOnce: N callers asking at the same head share
// one walk; a repeat at that head, with or without an anchor, is answered without another;
// a new record walks again.
func TestConcurrentVerifiesAtOneHeadWalkTheChainOnce(t *testing.T) {
	svc := open(t)
	appendRuns(t, svc, runNames(200)...)
	// Every stamp counts as taken long after the file's last change, so the finished walk's
	// answer can be given again (TestTamperingAfterACachedVerifyIsFound keeps the real clock).
	svc.verifier.now = func() time.Time { return time.Now().Add(time.Hour) }
	release := holdWalks(t, svc)

	const callers = 16
	answers := make(chan *auditv1.VerifyResponse, callers)
	errs := make(chan error, callers)
	for range callers {
		go func() {
			resp, err := svc.Verify(as(""), &auditv1.VerifyRequest{})
			answers <- resp
			errs <- err
		}()
	}
	requireWaiting(t, svc, callers)
	release()
	for range callers {
		require.NoError(t, <-errs)
		resp := <-answers
		require.True(t, resp.GetOk(), resp.GetReason())
		require.Equal(t, uint64(200), resp.GetChecked())
		require.Equal(t, uint64(200), resp.GetHeadSeq())
	}
	require.Equal(t, 1, walks(svc), "one walk for every caller at the head")

	head := verifyAt(t, svc, 0, "")
	require.True(t, head.GetOk())
	require.Equal(t, uint64(200), head.GetChecked())
	list, err := svc.List(as(""), &auditv1.ListRequest{PageSize: 200})
	require.NoError(t, err)
	rec100, rec101 := list.GetRecords()[99], list.GetRecords()[100]
	require.True(t, verifyAt(t, svc, head.GetHeadSeq(), head.GetHeadHash()).GetOk(), "the head it printed is an anchor")
	require.True(t, verifyAt(t, svc, 100, rec100.GetHash()).GetOk(), "an anchor inside the log")
	wrong := verifyAt(t, svc, 100, rec101.GetHash())
	require.False(t, wrong.GetOk())
	require.Equal(t, uint64(100), wrong.GetFirstBroken())
	require.Equal(t, uint64(99), wrong.GetChecked())
	require.Contains(t, wrong.GetReason(), "does not pass through the anchor you kept")
	past := verifyAt(t, svc, 201, rec100.GetHash())
	require.False(t, past.GetOk())
	require.Contains(t, past.GetReason(), "records were removed from its end")
	require.Equal(t, 1, walks(svc), "repeats at the same head, anchored or not, reuse the walk")

	appendRuns(t, svc, "r200")
	resp := verifyAt(t, svc, 0, "")
	require.True(t, resp.GetOk(), resp.GetReason())
	require.Equal(t, uint64(201), resp.GetChecked(), "a new head is verified")
	require.Equal(t, uint64(201), resp.GetHeadSeq())
	require.Equal(t, 2, walks(svc))
}

// TestACallerThatLeavesAWalkLeavesTheOthersTheirAnswer: a shared walk runs under none of its
// callers' contexts; it stops only when every caller has left.
func TestACallerThatLeavesAWalkLeavesTheOthersTheirAnswer(t *testing.T) {
	svc := open(t)
	appendRuns(t, svc, runNames(50)...)
	release := holdWalks(t, svc)

	ctx, cancel := context.WithCancel(as(""))
	left := make(chan error, 1)
	go func() {
		_, err := svc.Verify(ctx, &auditv1.VerifyRequest{})
		left <- err
	}()
	requireWaiting(t, svc, 1)
	stays := make(chan *auditv1.VerifyResponse, 1)
	go func() {
		resp, err := svc.Verify(as(""), &auditv1.VerifyRequest{})
		assertNoError(t, err)
		stays <- resp
	}()
	requireWaiting(t, svc, 2)
	cancel()
	require.Equal(t, codes.Canceled, status.Code(<-left))
	requireWaiting(t, svc, 1)
	release()
	resp := <-stays
	require.True(t, resp.GetOk(), resp.GetReason())
	require.Equal(t, uint64(50), resp.GetChecked())
	require.Equal(t, 1, walks(svc))
}

func assertNoError(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Error(err)
	}
}

// TestTamperingAfterACachedVerifyIsFound: a verified, cached answer is not given again once
// something else has written the file: a byte flipped in place in a stored record, while the
// service holds the file open, is named by the next Verify.
func TestTamperingAfterACachedVerifyIsFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	svc, err := Open(Config{DBPath: path})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	runs := runNames(30)
	runs[16] = "tamper-target"
	appendRuns(t, svc, runs...)
	// A stamp is trusted only once the file's last change is settle old: wait for it, so the
	// walk's answer is cached.
	require.Eventually(t, func() bool { _, trusted := svc.verifier.stamp(); return trusted },
		defaultSettle+5*time.Second, 50*time.Millisecond)

	require.True(t, verifyAt(t, svc, 0, "").GetOk())
	require.True(t, verifyAt(t, svc, 0, "").GetOk())
	require.Equal(t, 1, walks(svc), "the second answer came from the cache")

	// Flip a byte of record 17's body in place, as a process ignoring bbolt's lock would (the
	// service reads the file through a shared mapping, so it sees the change). Stale copies
	// in free pages may hold the needle too; flipping them changes nothing live.
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	require.NoError(t, err)
	needle := []byte(`"run_id":"tamper-target"`)
	found := 0
	for i := 0; ; {
		j := bytes.Index(data[i:], needle)
		if j < 0 {
			break
		}
		at := i + j + len(`"run_id":"t`)
		_, err := f.WriteAt([]byte{data[at] ^ 0x01}, int64(at))
		require.NoError(t, err)
		found++
		i += j + len(needle)
	}
	require.NoError(t, f.Close())
	require.NotZero(t, found, "the record's body is in the file")

	resp := verifyAt(t, svc, 0, "")
	require.False(t, resp.GetOk(), "the cached answer was not given again")
	require.Equal(t, uint64(17), resp.GetFirstBroken(), resp.GetReason())
	require.Contains(t, resp.GetReason(), "hash mismatch")
	require.Equal(t, 2, walks(svc))
}
