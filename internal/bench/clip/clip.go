// Package clip shortens a tool's output for an error message.
package clip

// String returns s cut to its first n bytes, with "…" when it was longer.
func String(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
