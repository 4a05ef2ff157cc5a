package testutil

import (
	"bufio"
	"net"
	"time"
)

// ServeConns accepts connections on ln until ln is closed (the caller closes
// it, usually with t.Cleanup) and runs handle on each one in its own
// goroutine, closing the connection when handle returns.
func ServeConns(ln net.Listener, handle func(c net.Conn)) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// AnswerLines reads lines from c and writes answer plus a newline after each
// one, until the peer closes, an error occurs or no line comes within idle.
func AnswerLines(c net.Conn, idle time.Duration, answer string) {
	rd := bufio.NewReader(c)
	for {
		_ = c.SetDeadline(time.Now().Add(idle))
		if _, err := rd.ReadString('\n'); err != nil {
			return
		}
		if _, err := c.Write([]byte(answer + "\n")); err != nil {
			return
		}
	}
}
