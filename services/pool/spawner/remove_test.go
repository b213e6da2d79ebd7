package spawner

import (
	"context"
	"errors"
	"testing"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/stretchr/testify/require"
)

// removingEngine answers a remove as the engine does while AutoRemove is already removing the
// container, which is then gone after a few list calls.
type removingEngine struct {
	DockerAPI
	lists int
}

func (e *removingEngine) ContainerRemove(context.Context, string, client.ContainerRemoveOptions) (client.ContainerRemoveResult, error) {
	return client.ContainerRemoveResult{}, errors.New("Error response from daemon: removal of container abc is already in progress")
}

func (e *removingEngine) ContainerList(context.Context, client.ContainerListOptions) (client.ContainerListResult, error) {
	e.lists++
	if e.lists < 3 {
		return client.ContainerListResult{Items: []container.Summary{{ID: "abc"}}}, nil
	}
	return client.ContainerListResult{}, nil
}

// TestRemoveWaitsForARemovalInProgress: a close racing the engine's own AutoRemove is not a
// failure (it was a flaky "removal already in progress" error); it waits for the container to go.
func TestRemoveWaitsForARemovalInProgress(t *testing.T) {
	e := &removingEngine{}
	d := &Docker{api: e}
	byUs, err := d.remove(t.Context(), "abc")
	require.NoError(t, err)
	require.False(t, byUs)
	require.Equal(t, 3, e.lists, "returned once the container was gone")

	e.lists = -1000 // never gone
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = d.remove(ctx, "abc")
	require.ErrorContains(t, err, "still being removed")
}
