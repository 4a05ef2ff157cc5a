// Command podserver is the kubenode test's only container image content: started as /pause it
// is the pod sandbox (waits for SIGTERM/SIGINT), otherwise it answers every HTTP request on
// :8080 with its hostname (the pod's name). Static, no libc, no shell.
package main

import (
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

func main() {
	if filepath.Base(os.Args[0]) == "pause" {
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
		<-c
		return
	}
	host, _ := os.Hostname()
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(host)) })
	if err := http.ListenAndServe(":8080", nil); err != nil {
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(1)
	}
}
