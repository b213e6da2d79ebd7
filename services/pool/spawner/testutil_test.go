package spawner

import (
	"archive/tar"
	"bufio"
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

func tarOf(files map[string]string) (io.Reader, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, content := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write([]byte(content)); err != nil {
			return nil, err
		}
	}
	return &buf, tw.Close()
}

func ioCopyLimited(dst io.Writer, src io.Reader, n int64) (int64, error) {
	return io.Copy(dst, io.LimitReader(src, n))
}

// waitForLine reads r until a line contains want, failing after d.
func waitForLine(t *testing.T, r io.Reader, want string, d time.Duration) {
	t.Helper()
	found := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.Contains(sc.Text(), want) {
				found <- true
				// Keep draining so the writer never blocks.
				for sc.Scan() {
				}
				return
			}
		}
		found <- false
	}()
	select {
	case ok := <-found:
		if !ok {
			t.Fatalf("the output ended without %q", want)
		}
	case <-time.After(d):
		t.Fatalf("no %q within %s", want, d)
	}
}
