package cli

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
)

// documentTenantUsage is the help of every documents command's --tenant.
const documentTenantUsage = "the document's tenant (default: the key's tenant, else \"default\")"

// uploadChunk is how much of a document each PutDocument message carries: well under the
// 4 MiB a gRPC message may hold.
const uploadChunk = 1 << 20

func newDocumentsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "documents",
		Aliases: []string{"docs"},
		Short:   "Store documents that tool arguments name as my-documents://<id> (needs run:execute)",
		Long: `documents keeps a tenant's documents in the pool's built-in store. A tool argument that is
exactly my-documents://<id> becomes the document's content, base64, in calls to the servers an
agent's document_resolver lists (docs/agents.md). A deployment that points the pool at its own
document service (documents.url_template) has no built-in store.`,
	}
	var tenant, name, mediaType, out string
	var force bool
	put := &cobra.Command{
		Use:   "put FILE",
		Short: "Store FILE (at most documents.max_bytes, 10 MiB by default) and print its id",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := openInput(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			if name == "" {
				name = filepath.Base(args[0])
			}
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			stream, err := client.PutDocument(ctx)
			if err != nil {
				return err
			}
			msg := &poolv1.PutDocumentRequest{Tenant: tenant, Name: name, MediaType: mediaType}
			buf := make([]byte, uploadChunk)
			for {
				n, rerr := io.ReadFull(f, buf)
				msg.Content = buf[:n]
				if msg.GetName() != "" && msg.GetMediaType() == "" {
					msg.MediaType = guessMediaType(args[0], msg.Content)
				}
				if n > 0 || msg.GetName() != "" {
					// A send that fails means the server answered already: its answer,
					// from CloseAndRecv, says why.
					if err := stream.Send(msg); err != nil {
						break
					}
				}
				msg = &poolv1.PutDocumentRequest{}
				if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
					break
				}
				if rerr != nil {
					return fmt.Errorf("reading %s: %w", args[0], rerr)
				}
			}
			resp, err := stream.CloseAndRecv()
			if err != nil {
				return err
			}
			if g.output == "json" {
				return printJSON(g.stdout, resp.GetDocument())
			}
			_, err = linef(g.stdout, "%s\n", resp.GetDocument().GetDocumentId())
			return err
		},
	}
	put.Flags().StringVar(&name, "name", "", "a label for people (default: the file's name)")
	put.Flags().StringVar(&mediaType, "media-type", "", "the content's media type, e.g. application/pdf (default: from the file's extension, else its first bytes)")
	put.Flags().StringVar(&tenant, "tenant", "", documentTenantUsage)

	get := &cobra.Command{
		Use:   "get ID [--out FILE [--force]]",
		Short: "Show a document's metadata; --out FILE writes its content to FILE (it refuses to replace a file without --force)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out != "" && !force {
				if _, err := os.Lstat(out); err == nil {
					return usagef("%s already exists: pass --force to replace it, or choose another --out", out)
				}
			}
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			stream, err := client.GetDocument(ctx, &poolv1.GetDocumentRequest{DocumentId: args[0], Tenant: tenant})
			if err != nil {
				return err
			}
			var doc *poolv1.Document
			var content []byte
			for {
				msg, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				if doc == nil {
					doc = msg.GetDocument()
				}
				content = append(content, msg.GetContent()...)
			}
			if out != "" {
				// Written as received, never printed: a document's bytes are no text for a
				// terminal. Beside the target first (0600) and moved into place once whole, as
				// audit export does, so an existing file is replaced only with --force.
				f, err := newExportFile(out, force)
				if err != nil {
					return err
				}
				_, err = f.f.Write(content)
				if err = f.finish(err); err != nil {
					return fmt.Errorf("cannot write %s: %w", sprintLine("%q", out), pathErr(err))
				}
			}
			if g.output == "json" {
				return printJSON(g.stdout, doc)
			}
			return kv(g.stdout,
				"document", doc.GetDocumentId(),
				"tenant", doc.GetTenant(),
				"name", orDash(doc.GetName()),
				"media type", orDash(doc.GetMediaType()),
				"size", fmt.Sprintf("%d bytes", doc.GetSize()),
				"sha256", doc.GetSha256(),
				"created", ts(doc.GetCreateTime()),
				"reference", "my-documents://"+doc.GetDocumentId(),
			)
		},
	}
	get.Flags().StringVar(&out, "out", "", "write the content to this file (created 0600)")
	get.Flags().BoolVar(&force, "force", false, "replace the --out file if it exists")
	get.Flags().StringVar(&tenant, "tenant", "", documentTenantUsage)

	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Delete a document; a reference to it is refused from then on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, ctx, cancel, err := g.pool(cmd.Context())
			if err != nil {
				return err
			}
			defer cancel()
			if _, err := client.DeleteDocument(ctx, &poolv1.DeleteDocumentRequest{DocumentId: args[0], Tenant: tenant}); err != nil {
				return err
			}
			// The REST answer is {}: say what was deleted, as graphs delete does.
			if g.output == "json" {
				return printFields(g.stdout, "deleted", args[0])
			}
			_, err = linef(g.stdout, "deleted %s\n", args[0])
			return err
		},
	}
	del.Flags().StringVar(&tenant, "tenant", "", documentTenantUsage)
	cmd.AddCommand(put, get, del)
	return cmd
}

// guessMediaType is a file's media type from its extension, else from its first bytes (as
// net/http sniffs them); "" when neither says more than "some bytes".
func guessMediaType(path string, head []byte) string {
	if t := mime.TypeByExtension(filepath.Ext(path)); t != "" {
		return t
	}
	if t := http.DetectContentType(head); t != "application/octet-stream" {
		return t
	}
	return ""
}
