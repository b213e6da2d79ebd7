package cli

import (
	"fmt"
	"strings"

	"github.com/distribution/reference"
	"github.com/moby/moby/client"
	"github.com/spf13/cobra"

	"github.com/ringfence/ringfence/internal/isoimage"
)

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "image", Short: "Isolation images for the pool (talks to the local Docker engine)"}
	var binaries []string
	var name string
	var labels []string
	build := &cobra.Command{
		Use:   "build --binary PATH [--binary PATH ...] [--name NAME]",
		Short: "Build a FROM-scratch isolation image from static binaries; pulls nothing",
		Long: `build puts each static binary in /bin of a FROM-scratch image (PATH=/bin), loads it into the
local Docker engine (DOCKER_HOST or the default socket) and prints the pinned reference to set
as RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE. Registrations then name a binary as their command.
Dynamically linked binaries and scripts are refused: scratch has no loader and no shell.`,
		Example: `  CGO_ENABLED=0 go build -o ./mcp/ ./cmd/my-mcp-server
  ringfence image build --binary ./mcp/my-mcp-server --name ringfence-mcp:2026-11`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(binaries) == 0 {
				return usagef("name at least one --binary")
			}
			labelMap := make(map[string]string, len(labels))
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return usagef("--label %q must be KEY=VALUE, e.g. --label org.example.team=search", l)
				}
				labelMap[k] = v
			}
			// Checked before anything is built: the engine would refuse the tag only after the
			// image was loaded, leaving it untagged.
			if name != "" {
				if _, err := reference.ParseNormalizedNamed(name); err != nil {
					return usagef("--name %s is not an image name (%v): lower-case letters, digits and . _ - / in the name, a tag after ':', e.g. --name ringfence-mcp:2026-11", sprintLine("%q", name), err)
				}
			}
			docker, err := client.New(client.FromEnv)
			if err != nil {
				return fmt.Errorf("cannot create a Docker client: %w", err)
			}
			defer docker.Close()
			ref, err := isoimage.Build(cmd.Context(), docker, isoimage.BuildOptions{Binaries: binaries, Name: name, Progress: g.stderr, Labels: labelMap})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printFields(g.stdout, "image", ref, "name", name)
			}
			_, err = linef(g.stdout, "%s\n\nset it for the pool:\n  export RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE=%s\n", ref, ref)
			return err
		},
	}
	build.Flags().StringArrayVar(&binaries, "binary", nil, "a static executable to put in /bin (repeatable)")
	build.Flags().StringVar(&name, "name", "", "tag the image, e.g. ringfence-mcp:2026-11 (the pool is configured with the printed ID)")
	build.Flags().StringArrayVar(&labels, "label", nil, "a KEY=VALUE label in the image's config (repeatable); the demo labels its image with the checkout, for make clean")
	cmd.AddCommand(build)
	return cmd
}
