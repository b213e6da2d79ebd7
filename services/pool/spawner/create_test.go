package spawner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// creatingEngine answers a create only when told to, as a loaded engine does, and records the
// creates and removals it was asked for.
type creatingEngine struct {
	DockerAPI
	entered chan struct{} // closed by the first create
	answer  chan struct{}
	mu      sync.Mutex
	created int
	removed []string
}

func (e *creatingEngine) ContainerCreate(ctx context.Context, _ client.ContainerCreateOptions) (client.ContainerCreateResult, error) {
	close(e.entered)
	select {
	case <-e.answer:
	case <-ctx.Done():
		// What a real client sees; the engine may still create the container.
		return client.ContainerCreateResult{}, ctx.Err()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.created++
	return client.ContainerCreateResult{ID: "c0ffee"}, nil
}

func (e *creatingEngine) ContainerRemove(_ context.Context, id string, _ client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.removed = append(e.removed, id)
	return client.ContainerRemoveResult{}, nil
}

func creatingDocker(e *creatingEngine) (*Docker, *Kit) {
	cfg := Config{PoolID: "p", StartTimeout: 30 * time.Second, MaxMessageBytes: 1 << 20, StderrTailBytes: 1 << 10}
	d := &Docker{api: e, cfg: cfg, img: &resolvedImage{id: "sha256:" + "ab"}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	return d, &Kit{r: &Router{cfg: cfg}}
}

// TestACallerThatLeftStartsNoContainer: a spawn whose caller already gave up asks the engine
// for nothing.
func TestACallerThatLeftStartsNoContainer(t *testing.T) {
	e := &creatingEngine{entered: make(chan struct{}), answer: make(chan struct{})}
	d, kit := creatingDocker(e)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := d.Spawn(ctx, &Spec{ServerRef: "fx", Command: "x", Purpose: PurposeRun}, kit)
	require.ErrorIs(t, err, context.Canceled)
	require.Zero(t, e.created)
	require.Empty(t, e.removed)
}

// TestACreateTheCallerAbandonsIsRemoved: a caller that gives up while the engine is still
// creating the container does not cut the create short (the engine could create it after any
// removal sent on the caller's behalf, and a container never started is never auto-removed):
// the create is awaited, and the container it made is removed.
func TestACreateTheCallerAbandonsIsRemoved(t *testing.T) {
	e := &creatingEngine{entered: make(chan struct{}), answer: make(chan struct{})}
	d, kit := creatingDocker(e)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := d.Spawn(ctx, &Spec{ServerRef: "fx", Command: "x", Purpose: PurposeRun}, kit)
		done <- err
	}()
	<-e.entered
	cancel()
	select {
	case err := <-done:
		t.Fatalf("the spawn returned before the engine answered the create: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(e.answer)
	err := <-done
	require.True(t, errors.Is(err, context.Canceled), "%v", err)
	require.Equal(t, 1, e.created)
	require.Equal(t, []string{"c0ffee"}, e.removed, "the container the create made is removed")
}
