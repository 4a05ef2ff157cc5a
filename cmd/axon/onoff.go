package main

import "fmt"

// onOff is a pflag value spelled on|off (--big-tcp).
type onOff struct{ b *bool }

func (o *onOff) String() string {
	if o.b != nil && *o.b {
		return "on"
	}
	return "off"
}

func (o *onOff) Set(s string) error {
	switch s {
	case "on", "true":
		*o.b = true
	case "off", "false":
		*o.b = false
	default:
		return fmt.Errorf("%q: want on or off", s)
	}
	return nil
}

func (o *onOff) Type() string { return "on|off" }
