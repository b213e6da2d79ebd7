package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/ringfence/ringfence/internal/mtls"
)

func newCertsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "certs", Short: "Development certificates for split deployments"}
	var dir string
	var hosts []string
	var force bool
	initCmd := &cobra.Command{
		Use:   "init",
		Short: "Write a development CA and one certificate per service (identity spiffe://ringfence/service/<name>)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// --host adds to the loopback names, which the CLI and local probes use.
			all := []string{"localhost", "127.0.0.1", "::1"}
			for _, h := range hosts {
				if !slices.Contains(all, h) {
					all = append(all, h)
				}
			}
			files, err := mtls.InitDevCA(dir, mtls.DevCAOptions{Hosts: all, Force: force})
			if errors.Is(err, mtls.ErrCAExists) {
				// Like an --out onto an existing file: the command line is what to change.
				return usageError{err}
			}
			if err != nil {
				return err
			}
			if g.output == "json" {
				type file struct {
					Path    string `json:"path"`
					Service string `json:"service"`
					Private bool   `json:"private"`
				}
				out := struct {
					Dir   string `json:"dir"`
					Files []file `json:"files"`
				}{Dir: dir, Files: []file{}}
				for _, f := range files {
					out.Files = append(out.Files, file{f.Path, f.Service, f.Private})
				}
				b, err := json.MarshalIndent(out, "", "  ")
				if err != nil {
					return err
				}
				_, err = g.stdout.Write(append(b, '\n'))
				return err
			}
			t := newTable(g.stdout, "FILE", "SERVICE", "PRIVATE")
			for _, f := range files {
				t.row(f.Path, orDash(f.Service), fmt.Sprint(f.Private))
			}
			if err := t.flush(); err != nil {
				return err
			}
			_, err = linef(g.stdout, "\nstart each service with RINGFENCE_TLS__CERT_FILE=%[1]s/<svc>.pem RINGFENCE_TLS__KEY_FILE=%[1]s/<svc>-key.pem RINGFENCE_TLS__CLIENT_CA_FILE=%[1]s/ca.pem\n", dir)
			return err
		},
	}
	initCmd.Flags().StringVar(&dir, "dir", "", "directory to write into (created 0700)")
	initCmd.Flags().StringSliceVar(&hosts, "host", nil, "DNS names and IPs the service certificates are valid for, besides localhost, 127.0.0.1 and ::1 (repeat or comma-separate)")
	initCmd.Flags().BoolVar(&force, "force", false, "replace an existing set")
	_ = initCmd.MarkFlagRequired("dir")
	cmd.AddCommand(initCmd)
	return cmd
}
