package isoimage_test

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/moby/moby/client"
	"github.com/ringfence/ringfence/internal/isoimage"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/ringfence/ringfence/internal/testutil/fixtures"
	"github.com/stretchr/testify/require"
)

// makeELF returns a minimal 64-bit little-endian ELF executable header with
// one program header: PT_INTERP naming interp, or PT_LOAD when interp is "".
func makeELF(t *testing.T, machine elf.Machine, interp string) []byte {
	t.Helper()
	const ehsize, phsize = 64, 56
	var buf bytes.Buffer
	hdr := elf.Header64{
		Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: uint32(elf.EV_CURRENT),
		Phoff: ehsize, Ehsize: ehsize, Phentsize: phsize, Phnum: 1, Shentsize: 64,
	}
	copy(hdr.Ident[:], elf.ELFMAG)
	hdr.Ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	hdr.Ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	hdr.Ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, hdr))
	prog := elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Align: 0x1000}
	if interp != "" {
		data := append([]byte(interp), 0)
		prog = elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R), Off: ehsize + phsize, Filesz: uint64(len(data)), Memsz: uint64(len(data)), Align: 1}
		require.NoError(t, binary.Write(&buf, binary.LittleEndian, prog))
		buf.Write(data)
		return buf.Bytes()
	}
	require.NoError(t, binary.Write(&buf, binary.LittleEndian, prog))
	return buf.Bytes()
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, data, 0o755))
	return p
}

// refusingEngine fails the test if Build reaches the engine.
type refusingEngine struct{ t *testing.T }

func (e refusingEngine) ImageLoad(context.Context, io.Reader, ...client.ImageLoadOption) (client.ImageLoadResult, error) {
	e.t.Fatal("Build reached the engine with binaries it should have refused")
	return nil, nil
}

func (e refusingEngine) ImageInspect(context.Context, string, ...client.ImageInspectOption) (client.ImageInspectResult, error) {
	e.t.Fatal("Build reached the engine with binaries it should have refused")
	return client.ImageInspectResult{}, nil
}

func (e refusingEngine) ImageTag(context.Context, client.ImageTagOptions) (client.ImageTagResult, error) {
	e.t.Fatal("Build reached the engine with binaries it should have refused")
	return client.ImageTagResult{}, nil
}

func TestBuildRefuses(t *testing.T) {
	dir := t.TempDir()
	static := writeFile(t, dir, "static", makeELF(t, elf.EM_X86_64, ""))
	dynamic := writeFile(t, dir, "dynamic", makeELF(t, elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2"))
	arm := writeFile(t, filepath.Join(dir), "arm-static", makeELF(t, elf.EM_AARCH64, ""))
	script := writeFile(t, dir, "script", []byte("#!/bin/sh\necho hi\n"))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "other"), 0o755))
	dupe := writeFile(t, filepath.Join(dir, "other"), "static", makeELF(t, elf.EM_X86_64, ""))
	badName := writeFile(t, dir, "bad name", makeELF(t, elf.EM_X86_64, ""))

	tests := []struct {
		name    string
		bins    []string
		wantErr string
	}{
		{name: "nothing", bins: nil, wantErr: "no binaries"},
		{name: "missing file", bins: []string{filepath.Join(dir, "nope")}, wantErr: "nope does not exist: build the server first"},
		{name: "directory", bins: []string{dir}, wantErr: "not a regular file"},
		{name: "script", bins: []string{script}, wantErr: "not an ELF executable"},
		{name: "dynamically linked", bins: []string{dynamic}, wantErr: "dynamically linked (interpreter /lib64/ld-linux-x86-64.so.2)"},
		{name: "duplicate names", bins: []string{static, dupe}, wantErr: "would both be /bin/static"},
		{name: "mixed architectures", bins: []string{static, arm}, wantErr: "one image holds one architecture"},
		{name: "bad command name", bins: []string{badName}, wantErr: "not a usable command name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := isoimage.Build(t.Context(), refusingEngine{t}, isoimage.BuildOptions{Binaries: tt.bins})
			require.ErrorContains(t, err, tt.wantErr)
			require.True(t, strings.HasPrefix(err.Error(), "isoimage: "), err.Error())
		})
	}
}

// TestBuildRefusesHostDynamicBinary uses a real dynamically linked program
// of the host when there is one (there is on every glibc or musl system).
func TestBuildRefusesHostDynamicBinary(t *testing.T) {
	for _, p := range []string{"/bin/true", "/usr/bin/true", "/bin/ls"} {
		f, err := elf.Open(p)
		if err != nil {
			continue
		}
		dynamic := false
		for _, prog := range f.Progs {
			dynamic = dynamic || prog.Type == elf.PT_INTERP
		}
		_ = f.Close()
		if !dynamic {
			continue
		}
		_, err = isoimage.Build(t.Context(), refusingEngine{t}, isoimage.BuildOptions{Binaries: []string{p}})
		require.ErrorContains(t, err, "dynamically linked")
		return
	}
	t.Skip("no dynamically linked program on this host")
}

var pinned = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

func TestBuild(t *testing.T) {
	docker := dockertest.RequireEngine(t)
	set := fixtures.Binaries(t)
	bins := []string{set.Path(t, fixtures.MCPFixture), set.Path(t, fixtures.SDKMemory)}
	tag := "ringfence-test/isoimage:" + set.Hash[:12]
	t.Cleanup(func() {
		_, _ = docker.ImageRemove(context.Background(), tag, client.ImageRemoveOptions{})
	})

	var progress bytes.Buffer
	labels := dockertest.CheckoutLabels(t)
	ref, err := isoimage.Build(t.Context(), docker, isoimage.BuildOptions{Binaries: bins, Name: tag, Progress: &progress, Labels: labels})
	require.NoError(t, err)
	require.Regexp(t, pinned, ref)
	out := progress.String()
	require.Contains(t, out, "isoimage: /bin/mcpfixture")
	require.Contains(t, out, "isoimage: /bin/sdk-memory")
	require.Contains(t, out, "engine: Loaded image ID: "+ref)
	require.Contains(t, out, "isoimage: pinned reference "+ref)

	img, err := docker.ImageInspect(t.Context(), tag)
	require.NoError(t, err)
	require.Equal(t, ref, img.ID, "the tag points at the returned reference")
	require.Equal(t, "linux", img.Os)
	require.Equal(t, runtime.GOARCH, img.Architecture)
	require.Equal(t, []string{"PATH=/bin"}, img.Config.Env)
	require.Equal(t, labels, img.Config.Labels)
	require.Empty(t, img.Config.Volumes)
	require.Empty(t, img.Config.Entrypoint)
	require.Len(t, img.RootFS.Layers, 1)

	again, err := isoimage.Build(t.Context(), docker, isoimage.BuildOptions{Binaries: bins, Labels: labels})
	require.NoError(t, err)
	require.Equal(t, ref, again, "the same binaries and labels give the same image")
}
