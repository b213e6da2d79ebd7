// Package isoimage builds Ringfence's isolation image: a FROM-scratch image
// that holds nothing but the operator's static MCP server binaries in /bin.
// The pool runs every stdio server in this image, so it must contain no shell,
// no package manager and no loader that a registration could steer, and its
// reference must be pinned by the engine's own ID.
//
// The image is assembled here as a docker-archive tarball and handed to the
// engine with ImageLoad rather than built with ImageBuild: loading needs no
// builder (the classic builder is deprecated and BuildKit cannot be driven
// over the bare API), no Dockerfile, no build context upload of a whole
// directory, and it produces byte-identical layers for identical binaries, so
// rebuilding an unchanged set yields the same image ID. Nothing is pulled.
package isoimage

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/moby/moby/client"
)

// Engine is the part of the Docker Engine API that Build uses.
type Engine interface {
	ImageLoad(ctx context.Context, input io.Reader, opts ...client.ImageLoadOption) (client.ImageLoadResult, error)
	ImageInspect(ctx context.Context, image string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageTag(ctx context.Context, opts client.ImageTagOptions) (client.ImageTagResult, error)
}

var _ Engine = (*client.Client)(nil)

// BuildOptions says what goes into the image.
type BuildOptions struct {
	// Binaries are paths of static executables; each lands in /bin under its
	// base name, so base names must be distinct.
	Binaries []string
	// Name, when set, tags the image (e.g. "ringfence-mcp:2026-05"). The tag
	// is for people; the pool is configured with the returned ID.
	Name string
	// Progress receives one line per step; nil discards them.
	Progress io.Writer
	// Labels go into the image's config, e.g. CheckoutLabel for the checkout that built it
	// (so that its make clean removes the image, and no other checkout's). The same binaries
	// and labels always give the same image ID.
	Labels map[string]string
}

// CheckoutLabel marks an image a source checkout built (the demo's, the tests'), with the
// checkout's id as its value (scripts/checkout-id.sh: the first 16 hex digits of the SHA-256
// of the checkout's physical path). make clean removes the images labeled with its own id.
const CheckoutLabel = "org.ringfence.checkout"

// Bounds on what Build accepts: an isolation image is a handful of servers.
const (
	maxBinaries   = 256
	maxBinarySize = 1 << 30
	maxLoadOutput = 1 << 20
)

// epoch is the timestamp of every file and of the image itself, so that the
// same binaries always produce the same layer and the same image ID.
var epoch = time.Unix(0, 0).UTC()

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$`)

type binary struct {
	path string
	name string
	size int64
	arch string
}

// Build checks the binaries, loads the image into the engine and returns its
// pinned reference "sha256:<64 hex>", read back from the engine.
func Build(ctx context.Context, docker Engine, opts BuildOptions) (string, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	bins, arch, err := checkBinaries(opts.Binaries)
	if err != nil {
		return "", err
	}
	for _, b := range bins {
		fmt.Fprintf(progress, "isoimage: /bin/%s from %s (%s, static %s)\n", b.name, b.path, humanSize(b.size), b.arch)
	}

	layer, err := os.CreateTemp("", "ringfence-isoimage-layer-*.tar")
	if err != nil {
		return "", fmt.Errorf("isoimage: create layer file: %w", err)
	}
	defer func() {
		_ = layer.Close()
		_ = os.Remove(layer.Name())
	}()
	h := sha256.New()
	size, err := writeLayer(io.MultiWriter(layer, h), bins)
	if err != nil {
		return "", err
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))
	fmt.Fprintf(progress, "isoimage: layer %s (%s)\n", diffID, humanSize(size))

	config, err := imageConfig(arch, diffID, opts.Labels)
	if err != nil {
		return "", err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return "", fmt.Errorf("isoimage: rewind layer file: %w", err)
	}

	fmt.Fprintln(progress, "isoimage: loading the image into the engine")
	id, err := load(ctx, docker, layer, size, config, progress)
	if err != nil {
		return "", err
	}
	inspected, err := docker.ImageInspect(ctx, id)
	if err != nil {
		return "", fmt.Errorf("isoimage: inspect loaded image %s: %w", id, err)
	}
	if inspected.ID != id {
		return "", fmt.Errorf("isoimage: the engine reported image %s but inspecting it returned %s", id, inspected.ID)
	}
	if opts.Name != "" {
		if _, err := docker.ImageTag(ctx, client.ImageTagOptions{Source: id, Target: opts.Name}); err != nil {
			return "", fmt.Errorf("isoimage: tag %s as %q: %w", id, opts.Name, err)
		}
		fmt.Fprintf(progress, "isoimage: tagged %s\n", opts.Name)
	}
	fmt.Fprintf(progress, "isoimage: pinned reference %s\n", id)
	return id, nil
}

func checkBinaries(paths []string) ([]binary, string, error) {
	if len(paths) == 0 {
		return nil, "", errors.New("isoimage: no binaries given")
	}
	if len(paths) > maxBinaries {
		return nil, "", fmt.Errorf("isoimage: %d binaries given, at most %d fit", len(paths), maxBinaries)
	}
	seen := make(map[string]string, len(paths))
	bins := make([]binary, 0, len(paths))
	arch := ""
	for _, p := range paths {
		b, err := checkBinary(p)
		if err != nil {
			return nil, "", err
		}
		if prev, dup := seen[b.name]; dup {
			return nil, "", fmt.Errorf("isoimage: %s and %s would both be /bin/%s: rename one", prev, p, b.name)
		}
		seen[b.name] = p
		if arch == "" {
			arch = b.arch
		} else if arch != b.arch {
			return nil, "", fmt.Errorf("isoimage: %s is built for %s but %s is built for %s: one image holds one architecture", p, b.arch, bins[0].path, arch)
		}
		bins = append(bins, b)
	}
	return bins, arch, nil
}

// checkBinary refuses anything a FROM-scratch image cannot run: scripts (no
// interpreter), dynamically linked executables (no loader, no libraries)
// and executables for an architecture Build cannot name.
func checkBinary(path string) (binary, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return binary{}, fmt.Errorf("isoimage: binary %s does not exist: build the server first (CGO_ENABLED=0 go build -o DIR ./path/to/server) and pass the file it wrote", path)
	}
	if err != nil {
		return binary{}, fmt.Errorf("isoimage: %w", err)
	}
	if !st.Mode().IsRegular() {
		return binary{}, fmt.Errorf("isoimage: %s is not a regular file", path)
	}
	if st.Size() > maxBinarySize {
		return binary{}, fmt.Errorf("isoimage: %s is %s, more than the %s a binary may be", path, humanSize(st.Size()), humanSize(maxBinarySize))
	}
	name := filepath.Base(path)
	if !validName.MatchString(name) {
		return binary{}, fmt.Errorf("isoimage: %q is not a usable command name (letters, digits, '.', '_', '+', '-')", name)
	}
	f, err := elf.Open(path)
	if err != nil {
		return binary{}, fmt.Errorf("isoimage: %s is not an ELF executable: a scratch image has no interpreter for scripts", path)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return binary{}, fmt.Errorf("isoimage: %s is an ELF %s, not an executable", path, f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(io.LimitReader(prog.Open(), 256))
			return binary{}, fmt.Errorf("isoimage: %s is dynamically linked (interpreter %s): a scratch image has no loader or libraries; rebuild it static, e.g. CGO_ENABLED=0 go build",
				path, strings.TrimRight(string(interp), "\x00"))
		}
	}
	if libs, err := f.ImportedLibraries(); err == nil && len(libs) > 0 {
		return binary{}, fmt.Errorf("isoimage: %s needs shared libraries (%s): rebuild it static", path, strings.Join(libs, ", "))
	}
	arch, ok := elfArch(f)
	if !ok {
		return binary{}, fmt.Errorf("isoimage: %s is built for %s, which isoimage cannot name as an image architecture", path, f.Machine)
	}
	return binary{path: path, name: name, size: st.Size(), arch: arch}, nil
}

func elfArch(f *elf.File) (string, bool) {
	switch f.Machine {
	case elf.EM_X86_64:
		return "amd64", true
	case elf.EM_AARCH64:
		return "arm64", true
	case elf.EM_386:
		return "386", true
	case elf.EM_ARM:
		return "arm", true
	case elf.EM_RISCV:
		if f.Class == elf.ELFCLASS64 {
			return "riscv64", true
		}
	case elf.EM_PPC64:
		if f.Data == elf.ELFDATA2LSB {
			return "ppc64le", true
		}
	case elf.EM_S390:
		return "s390x", true
	}
	return "", false
}

// writeLayer writes the image's only layer: /bin with the binaries and an
// empty /tmp as the mount point of the pool's tmpfs.
func writeLayer(w io.Writer, bins []binary) (int64, error) {
	cw := &countingWriter{w: w}
	tw := tar.NewWriter(cw)
	dirs := []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX},
		{Typeflag: tar.TypeDir, Name: "tmp/", Mode: 0o1777, ModTime: epoch, Format: tar.FormatPAX},
	}
	for _, hdr := range dirs {
		if err := tw.WriteHeader(hdr); err != nil {
			return 0, fmt.Errorf("isoimage: write layer: %w", err)
		}
	}
	for _, b := range bins {
		if err := addFile(tw, b); err != nil {
			return 0, err
		}
	}
	if err := tw.Close(); err != nil {
		return 0, fmt.Errorf("isoimage: write layer: %w", err)
	}
	return cw.n, nil
}

func addFile(tw *tar.Writer, b binary) error {
	f, err := os.Open(b.path)
	if err != nil {
		return fmt.Errorf("isoimage: %w", err)
	}
	defer f.Close()
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: "bin/" + b.name, Mode: 0o755, Size: b.size, ModTime: epoch, Format: tar.FormatPAX}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("isoimage: write layer: %w", err)
	}
	// A file that changed size since it was checked fails here rather than
	// producing a layer whose header lies.
	if _, err := io.CopyN(tw, f, b.size); err != nil {
		return fmt.Errorf("isoimage: copy %s: %w", b.path, err)
	}
	return nil
}

// ociConfig is the part of the image configuration Build sets.
type ociConfig struct {
	Architecture string       `json:"architecture"`
	OS           string       `json:"os"`
	Created      time.Time    `json:"created"`
	Config       ociRunConfig `json:"config"`
	RootFS       ociRootFS    `json:"rootfs"`
	History      []ociHistory `json:"history"`
}

type ociRunConfig struct {
	Env []string `json:"Env"`
	// Labels marshal with sorted keys, so the config (and the image ID) is the same for
	// the same labels.
	Labels map[string]string `json:"Labels,omitempty"`
}

type ociRootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type ociHistory struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
}

func imageConfig(arch, diffID string, labels map[string]string) ([]byte, error) {
	cfg := ociConfig{
		Architecture: arch,
		OS:           "linux",
		Created:      epoch,
		Config:       ociRunConfig{Env: []string{"PATH=/bin"}, Labels: labels},
		RootFS:       ociRootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []ociHistory{{Created: epoch, CreatedBy: "ringfence image build"}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("isoimage: encode image config: %w", err)
	}
	return b, nil
}

// load streams a docker-archive (manifest.json, the config, one layer) into
// ImageLoad and returns the image ID the engine reports.
func load(ctx context.Context, docker Engine, layer io.Reader, layerSize int64, config []byte, progress io.Writer) (string, error) {
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: configName, RepoTags: []string{}, Layers: []string{"layer.tar"}}})
	if err != nil {
		return "", fmt.Errorf("isoimage: encode manifest: %w", err)
	}

	pr, pw := io.Pipe()
	go func() {
		pw.CloseWithError(writeArchive(pw, manifest, configName, config, layer, layerSize))
	}()
	// The reader is closed on every path so that the writer goroutine ends
	// even when the engine stops reading early.
	defer pr.Close()

	resp, err := docker.ImageLoad(ctx, pr, client.ImageLoadWithQuiet(false))
	if err != nil {
		return "", fmt.Errorf("isoimage: load image: %w", err)
	}
	defer resp.Close()
	return readLoadOutput(io.LimitReader(resp, maxLoadOutput), progress)
}

func writeArchive(w io.Writer, manifest []byte, configName string, config []byte, layer io.Reader, layerSize int64) error {
	tw := tar.NewWriter(w)
	small := []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {configName, config}}
	for _, f := range small {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "layer.tar", Mode: 0o644, Size: layerSize, ModTime: epoch}); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, layer, layerSize); err != nil {
		return err
	}
	return tw.Close()
}

// loadMessage is one line of the engine's JSON progress stream.
type loadMessage struct {
	Stream      string `json:"stream"`
	Status      string `json:"status"`
	Error       string `json:"error"`
	ErrorDetail *struct {
		Message string `json:"message"`
	} `json:"errorDetail"`
}

var loadedID = regexp.MustCompile(`Loaded image ID: (sha256:[0-9a-f]{64})`)

func readLoadOutput(r io.Reader, progress io.Writer) (string, error) {
	dec := json.NewDecoder(r)
	id, last := "", ""
	for {
		var m loadMessage
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("isoimage: read the engine's load output: %w", err)
		}
		if m.ErrorDetail != nil && m.ErrorDetail.Message != "" {
			return "", fmt.Errorf("isoimage: the engine refused the image: %s", m.ErrorDetail.Message)
		}
		if m.Error != "" {
			return "", fmt.Errorf("isoimage: the engine refused the image: %s", m.Error)
		}
		for _, line := range strings.Split(strings.TrimSpace(m.Stream+m.Status), "\n") {
			// Progress bars repeat their status line: show it once.
			if line == "" || line == last {
				continue
			}
			last = line
			fmt.Fprintf(progress, "engine: %s\n", line)
			if sm := loadedID.FindStringSubmatch(line); sm != nil {
				id = sm[1]
			}
		}
	}
	if id == "" {
		return "", errors.New("isoimage: the engine loaded the archive but did not report an image ID")
	}
	return id, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
