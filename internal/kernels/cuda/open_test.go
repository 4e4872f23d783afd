package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
)

// TestOpenMissingDriver: no libcuda → the clear error, at once.
func TestOpenMissingDriver(t *testing.T) {
	start := time.Now()
	_, err := open(libs{driver: []string{"libcuda-baton-missing.so.1"}}, 0)
	if err == nil || !strings.Contains(err.Error(), "libcuda-baton-missing.so.1 not found") {
		t.Fatalf("Open with a missing driver: %v", err)
	}
	if _, err := probe(libs{driver: []string{"libcuda-baton-missing.so.1"}}); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("Probe with a missing driver: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("failing took %v", d)
	}
	t.Log(err)
}

// TestOpenHere opens the real driver of this machine: on a machine
// without a GPU it must fail with one of the clear errors within seconds;
// with one it must work.
func TestOpenHere(t *testing.T) {
	start := time.Now()
	b, err := Open(0)
	elapsed := time.Since(start)
	desc, perr := Probe()
	if err != nil {
		if requireGPU() {
			t.Fatalf("BATON_REQUIRE_GPU=1 and Open(0): %v", err)
		}
		ok := false
		for _, want := range []string{"libcuda.so.1 not found", "no CUDA device", "driver too old", "cuInit failed", "need sm_80"} {
			ok = ok || strings.Contains(err.Error(), want)
		}
		if !ok {
			t.Fatalf("Open(0) failed without a clear reason: %v", err)
		}
		if perr == nil {
			t.Fatalf("Open failed (%v) but Probe succeeded: %s", err, desc)
		}
		t.Logf("no GPU here: %v (probe: %v), in %v", err, perr, elapsed)
	} else {
		defer b.Close()
		t.Logf("%s; probe: %s", b.Describe(), desc)
	}
	if elapsed > 10*time.Second {
		t.Fatalf("Open took %v", elapsed)
	}
}

// TestOpenWithoutLibraryPath runs Open in a child process whose loader
// finds no libcuda (LD_LIBRARY_PATH empty, a driver name nowhere on disk).
func TestOpenWithoutLibraryPath(t *testing.T) {
	if os.Getenv("BATON_CUDA_CHILD") == "1" {
		_, err := open(libs{driver: []string{"libcuda.so.0.baton-none"}}, 0)
		fmt.Println("ERR:", err)
		return
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^TestOpenWithoutLibraryPath$")
	cmd.Env = append(os.Environ(), "BATON_CUDA_CHILD=1", "LD_LIBRARY_PATH=")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("ERR: cuda: libcuda.so.0.baton-none not found")) {
		t.Fatalf("child output:\n%s", out)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
}

// TestFakeOpenErrors drives the fake driver into each failure Open names.
func TestFakeOpenErrors(t *testing.T) {
	l := fakeLibs(t)
	for _, c := range []struct {
		env, val, want string
	}{
		{"FAKE_CUDA_DRIVER_VERSION", "11040", "driver too old (CUDA 11.4, need 11.8)"},
		{"FAKE_CUDA_INIT_ERROR", "100", "no CUDA device (cuInit:"},
		{"FAKE_CUDA_INIT_ERROR", "999", "cuInit failed"},
		{"FAKE_CUDA_DEVICES", "0", "no CUDA device"},
		{"FAKE_CUDA_CC", "7.5", "is sm_75; the kernels need sm_80 or newer"},
	} {
		t.Run(c.env+"="+c.val, func(t *testing.T) {
			t.Setenv(c.env, c.val)
			_, err := open(l, 0)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error containing %q", err, c.want)
			}
			if c.env != "FAKE_CUDA_CC" {
				if _, err := probe(l); err == nil {
					t.Fatal("Probe succeeded")
				}
			}
		})
	}
	if _, err := open(l, 1); err == nil || !strings.Contains(err.Error(), "no CUDA device 1 (1 present)") {
		t.Fatalf("device 1: %v", err)
	}
	s, err := probe(l)
	if err != nil || !strings.Contains(s, "1 device: [0] Fake CUDA device") || !strings.Contains(s, "sm_90") ||
		!strings.HasSuffix(s, "; graphs yes, ipc yes") {
		t.Fatalf("probe: %q, %v", s, err)
	}
	t.Log(s)
	// A driver without one of the entry points.
	if _, err := open(libs{driver: []string{l.cublas[0]}}, 0); err == nil || !strings.Contains(err.Error(), "lacks cuDriverGetVersion") {
		t.Fatalf("library without the driver API: %v", err)
	}
	// No cuBLAS: the backend works on its own kernels and says so.
	b, err := open(libs{driver: l.driver, cublas: []string{"libcublas-baton-missing.so"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.blas != nil || !strings.Contains(b.Describe(), "no cublas (libcublas-baton-missing.so not found") {
		t.Fatalf("without cublas: %s", b.Describe())
	}
	t.Log(b.Describe())
}

// TestFakeContexts: the primary context is retained and released by Close;
// a driver without the primary-context calls gets a context of its own.
func TestFakeContexts(t *testing.T) {
	l := fakeLibs(t)
	b, err := open(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !b.primaryCtx {
		t.Fatal("not on the primary context")
	}
	b.Close()
	b = bareBackend(t)
	if b.primaryCtx {
		t.Fatal("primary context from a driver without one")
	}
	if s, err := probe(bareLibs(t)); err != nil || !strings.HasSuffix(s, "; graphs no, ipc no") {
		t.Fatalf("probe of a driver without graphs or IPC: %q, %v", s, err)
	}
	out := make([]float32, 2)
	b.Add(out, []float32{1, 2}, []float32{3, 4})
	if out[0] != 4 || out[1] != 6 {
		t.Fatalf("Add on an own context: %v", out)
	}
}

// TestFakeLaunchFailurePanics: a driver error inside an operation panics
// with the driver's message (kernels.Backend has no error results).
func TestFakeLaunchFailurePanics(t *testing.T) {
	b := fakeBackend(t)
	t.Setenv("FAKE_CUDA_LAUNCH_ERROR", "700")
	defer func() {
		r := recover()
		if r == nil || !strings.Contains(fmt.Sprint(r), "cuLaunchKernel bk_add") || !strings.Contains(fmt.Sprint(r), "CUDA_ERROR_ILLEGAL_ADDRESS") {
			t.Fatalf("recovered %v", r)
		}
		// The backend stays usable once the driver is.
		os.Unsetenv("FAKE_CUDA_LAUNCH_ERROR")
		out := make([]float32, 3)
		b.Add(out, []float32{1, 2, 3}, []float32{1, 1, 1})
		if out[2] != 4 {
			t.Fatalf("after the failure: %v", out)
		}
	}()
	b.Add(make([]float32, 3), []float32{1, 2, 3}, []float32{1, 1, 1})
}

func TestFakeClose(t *testing.T) {
	b := fakeBackend(t)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "after Close") {
			t.Fatalf("use after Close: %v", r)
		}
	}()
	b.Add(make([]float32, 1), []float32{1}, []float32{1})
}

// kernelSourceHash is the stamp of make kernels: sha256 over the lines
// "<sha256 hex>  <name>\n" of the .cu and .cuh files in byte order of name
// (`sha256sum <files> | sha256sum`).
func kernelSourceHash(dir string) (string, error) {
	var names []string
	for _, pat := range []string{"*.cu", "*.cuh"} {
		m, err := filepath.Glob(filepath.Join(dir, pat))
		if err != nil {
			return "", err
		}
		for _, p := range m {
			names = append(names, filepath.Base(p))
		}
	}
	if len(names) == 0 {
		return "", fmt.Errorf("no kernel sources in %s", dir)
	}
	slices.Sort(names)
	var list strings.Builder
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&list, "%s  %s\n", hex.EncodeToString(sum[:]), n)
	}
	sum := sha256.Sum256([]byte(list.String()))
	return hex.EncodeToString(sum[:]), nil
}

// TestFatbinStamp fails when the kernel sources differ from the ones the
// committed kernels.fatbin was built from.
func TestFatbinStamp(t *testing.T) {
	raw, err := os.ReadFile("kernels.sha256")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(raw))
	have, err := kernelSourceHash("kernels")
	if err != nil {
		t.Fatal(err)
	}
	if have != want {
		t.Fatalf("kernels/*.cu, *.cuh hash to %s but kernels.fatbin was built from %s: run make kernels and commit kernels.fatbin and kernels.sha256", have, want)
	}
	entries, err := fatbinEntries(fatbin)
	if err != nil {
		t.Fatalf("kernels.fatbin (%d bytes): %v", len(fatbin), err)
	}
	for _, want := range []string{"sm_80 ELF", "sm_90 ELF", "sm_90 PTX"} {
		if !slices.Contains(entries, want) {
			t.Errorf("kernels.fatbin has %v, lacks %s", entries, want)
		}
	}
}

// fatbinEntries lists a fatbin container's images as "sm_XY ELF|PTX": a
// 16-byte header (magic 0xBA55ED50, version, header size, payload size),
// then entries of a header (kind 1 PTX / 2 ELF at 0, header size at 4,
// image size at 8, architecture at 28) and the image.
func fatbinEntries(b []byte) ([]string, error) {
	le := binary.LittleEndian
	if len(b) < 16 || le.Uint32(b) != 0xba55ed50 {
		return nil, fmt.Errorf("no fatbin magic")
	}
	end := int(le.Uint16(b[6:])) + int(le.Uint64(b[8:]))
	if end > len(b) {
		return nil, fmt.Errorf("fatbin payload of %d bytes in %d", end, len(b))
	}
	var out []string
	for off := int(le.Uint16(b[6:])); off < end; {
		if off+32 > end {
			return nil, fmt.Errorf("truncated entry at %d", off)
		}
		kind := map[uint16]string{1: "PTX", 2: "ELF"}[le.Uint16(b[off:])]
		hs, size, arch := int(le.Uint32(b[off+4:])), int(le.Uint64(b[off+8:])), le.Uint32(b[off+28:])
		out = append(out, fmt.Sprintf("sm_%d %s", arch, kind))
		off += hs + size
	}
	return out, nil
}

// TestStampDetectsChange: the stamp moves with any edit, rename or new file.
func TestStampDetectsChange(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.cu", "x")
	write("b.cuh", "y")
	h0, _ := kernelSourceHash(dir)
	write("a.cu", "x ")
	h1, _ := kernelSourceHash(dir)
	write("a.cu", "x")
	os.Rename(filepath.Join(dir, "b.cuh"), filepath.Join(dir, "c.cuh"))
	h2, _ := kernelSourceHash(dir)
	write("d.cu", "")
	h3, _ := kernelSourceHash(dir)
	os.Remove(filepath.Join(dir, "d.cu"))
	os.Rename(filepath.Join(dir, "c.cuh"), filepath.Join(dir, "b.cuh"))
	h4, _ := kernelSourceHash(dir)
	if h0 == h1 || h0 == h2 || h0 == h3 || h1 == h2 || h0 != h4 {
		t.Fatalf("stamps %s %s %s %s %s", h0, h1, h2, h3, h4)
	}
	// And it is what `sha256sum files | sha256sum` gives for a known input.
	dir2 := t.TempDir()
	os.WriteFile(filepath.Join(dir2, "k.cu"), []byte("abc"), 0o644)
	got, _ := kernelSourceHash(dir2)
	line := "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  k.cu\n"
	sum := sha256.Sum256([]byte(line))
	if got != hex.EncodeToString(sum[:]) {
		t.Fatalf("stamp of one file: %s", got)
	}
}

// TestKernelNames: the Go list is the BK_KERNELS list of baton.cu.
func TestKernelNames(t *testing.T) {
	src, err := os.ReadFile("kernels/baton.cu")
	if err != nil {
		t.Fatal(err)
	}
	var inList []string
	for _, m := range regexp.MustCompile(`(?m)^\s*X\((\w+)\)`).FindAllSubmatch(src, -1) {
		inList = append(inList, string(m[1]))
	}
	if !slices.Equal(inList, kernelNames[:]) {
		t.Fatalf("BK_KERNELS %v\nkernelNames %v", inList, kernelNames)
	}
	// Every listed kernel is defined in the sources.
	all := src
	files, _ := filepath.Glob("kernels/*.cuh")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		all = append(all, b...)
	}
	// The geometry constants agree with the kernels' #defines.
	for name, v := range map[string]int{"BK_GEMV_MAXN": gemvMaxN, "BK_GEMV_WARPS": gemvWarps,
		"BK_ATTN_THREADS": attnThreads, "BK_ATTN_MAX_MEMBERS": attnMaxMembers, "BK_ATTN_ITEM_FIELDS": attnItemFields,
		"BK_ATTN_SEQ_FIELDS": attnSeqFields, "BK_ATTN_MAX_HD": attnMaxHD, "BK_F32": int(kernels.F32), "BK_F16": int(kernels.F16),
		"BK_Q8_0": int(kernels.Q8_0), "BK_BF16": int(kernels.BF16), "BK_MOE_SEG_FIELDS": moeSegFields, "BK_Q4_0": int(kernels.Q4_0),
		"BK_Q4_1": int(kernels.Q4_1), "BK_Q5_0": int(kernels.Q5_0), "BK_Q5_1": int(kernels.Q5_1), "BK_Q4_K": int(kernels.Q4_K),
		"BK_Q5_K": int(kernels.Q5_K), "BK_Q6_K": int(kernels.Q6_K), "BK_Q3_K": int(kernels.Q3_K), "BK_Q2_K": int(kernels.Q2_K), "BK_E4M3": int(kernels.F8E4M3)} {
		m := regexp.MustCompile(`(?m)^#define ` + name + ` (\d+)`).FindSubmatch(all)
		if m == nil || string(m[1]) != fmt.Sprint(v) {
			t.Errorf("#define %s: %q in the kernels, %d in Go", name, m, v)
		}
	}
	for _, n := range kernelNames {
		// Defined directly, or by a macro that writes extern "C" __global__.
		if !regexp.MustCompile(`(?s)extern "C" __global__.{0,100}?\b` + n + `\(|_KERNEL\(` + n + `,`).Match(all) {
			t.Errorf("kernel %s is not defined as extern \"C\" __global__", n)
		}
	}
}

// TestNoCUDAHeaders: the cgo side includes no CUDA header, so the package
// builds where no CUDA toolkit is installed (driver.h declares what it uses).
func TestNoCUDAHeaders(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	more, _ := filepath.Glob("*.[ch]")
	files = append(files, more...)
	inc := regexp.MustCompile(`(?m)^\s*#\s*include\s*[<"]([^>"]+)[>"]`)
	allowed := map[string]bool{"stddef.h": true, "stdint.h": true, "stdlib.h": true, "stdio.h": true, "string.h": true,
		"dlfcn.h": true, "driver.h": true}
	n := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range inc.FindAllSubmatch(b, -1) {
			n++
			if !allowed[string(m[1])] {
				t.Errorf("%s includes <%s>", f, m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("found no #include at all")
	}
}
