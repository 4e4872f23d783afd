package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// [text](target) and ![alt](target); the target ends at the first
	// space (a title may follow) or the closing parenthesis.
	mdLink = regexp.MustCompile(`!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// A path to a markdown file mentioned anywhere in the text, linked or not.
	mdMention = regexp.MustCompile(`(?:^|[^A-Za-z0-9_./-])((?:\.\./|\./)?[A-Za-z0-9_][A-Za-z0-9_./-]*\.md)\b`)
	urlRe     = regexp.MustCompile(`[a-z][a-z0-9+.-]*://[^\s)>\]` + "`" + `]+`)
	heading   = regexp.MustCompile(`(?m)^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$`)
)

// markdownFiles are the documents whose references must resolve: the
// README, every page under docs/ and deploy/, the gates' README and the
// changelog.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md", "test/gates/README.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		files = append(files, filepath.ToSlash(strings.TrimPrefix(d, root+string(filepath.Separator))))
	}
	err = filepath.WalkDir(filepath.Join(root, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// outsideFences is the text with fenced code blocks blanked (line count
// kept), since a link in an example is not a reference.
func outsideFences(text string) string {
	lines := strings.Split(text, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
			continue
		}
		if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// anchors are the heading ids GitHub gives a markdown file: lower case,
// punctuation dropped but for - and _, spaces to dashes, a repeat suffixed
// -1, -2, ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(outsideFences(text), -1) {
		h := strings.ToLower(m[1])
		var b strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r > 127 && !strings.ContainsRune("—–’“”…×→", r):
				b.WriteRune(r)
			}
		}
		id := b.String()
		if n := seen[id]; n > 0 {
			out[id+"-"+itoa(n)] = true
		} else {
			out[id] = true
		}
		seen[id]++
	}
	return out
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

func readRepo(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestLinks: every relative link in the documents names a file or folder
// of the repository, and a #fragment names a heading of the page it points
// at.
func TestLinks(t *testing.T) {
	n := 0
	for _, file := range markdownFiles(t) {
		text := readRepo(t, file)
		for _, m := range mdLink.FindAllStringSubmatch(outsideFences(text), -1) {
			target := m[1]
			if urlRe.MatchString(target) || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			path, frag, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
				if strings.HasPrefix(dest, "../") {
					t.Errorf("%s: link %q leaves the repository", file, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(dest))); err != nil {
					t.Errorf("%s: link %q: no such file in the repository", file, target)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(readRepo(t, dest))[frag] {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", file, target, dest, frag)
			}
		}
	}
	if n == 0 {
		t.Fatal("no relative links found; the pattern or the documents changed")
	}
}

// TestMarkdownMentions: every *.md path a document names, linked or in
// prose, is a file of the repository, taken from the document's folder or
// from the repository root.
func TestMarkdownMentions(t *testing.T) {
	n := 0
	for _, file := range markdownFiles(t) {
		text := urlRe.ReplaceAllString(readRepo(t, file), "")
		for _, m := range mdMention.FindAllStringSubmatch(text, -1) {
			p := m[1]
			n++
			fromDir := filepath.Join(root, filepath.Dir(filepath.FromSlash(file)), filepath.FromSlash(p))
			fromRoot := filepath.Join(root, filepath.FromSlash(p))
			if _, err := os.Stat(fromDir); err == nil {
				continue
			}
			if _, err := os.Stat(fromRoot); err == nil && !strings.HasPrefix(p, "../") {
				continue
			}
			t.Errorf("%s mentions %s, which is not a file of the repository", file, p)
		}
	}
	if n == 0 {
		t.Fatal("no *.md mentions found; the pattern or the documents changed")
	}
}

// TestAnchors checks the slug rule on headings of the kinds the documents use.
func TestAnchors(t *testing.T) {
	a := anchors("# baton — design\n## Who may talk to a worker\n### `baton serve` flags\n## A request, end to end (PD mode)\n## Notes\n## Notes\n```\n## not a heading\n```\n")
	for _, want := range []string{"baton--design", "who-may-talk-to-a-worker", "baton-serve-flags", "a-request-end-to-end-pd-mode", "notes", "notes-1"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a heading inside a code fence made an anchor")
	}
}
