package datapath

import (
	"github.com/axonhq/axon/internal/datapath/dptest"
	"github.com/axonhq/axon/internal/testutil"
)

// The shared test helpers (package dptest) under the names these tests use.
var (
	requireRoot     = dptest.RequireRoot
	randSuffix      = testutil.RandSuffix
	newNetns        = dptest.NewNetns
	inNetns         = dptest.InNetns
	testLogger      = dptest.Logger
	mustMAC         = dptest.MustMAC
	ipv4Packet      = dptest.IPv4Packet
	ipv6Packet      = dptest.IPv6Packet
	arpPacket       = dptest.ARPPacket
	forwarded       = dptest.Forwarded
	ipv4HeaderValid = dptest.IPv4HeaderValid
	nsConf          = dptest.NSConf
	ipNet           = dptest.IPNet
	ethHdr          = dptest.EthHdr
	udpPayload      = dptest.UDPPayload
	mapLen          = dptest.MapLen
	runEDT          = dptest.RunEDT
	runEDTCtx       = dptest.RunEDTCtx
	monoNow         = dptest.MonoNow
	bigTCP4         = dptest.BigTCP4
	setBigTCP       = dptest.SetBigTCP
	tcpBulkVia      = dptest.TCPBulkVia
	tcpBulk         = dptest.TCPBulk
	firstCPU        = dptest.FirstCPU
	pinOneCPU       = dptest.PinOneCPU
	logTCPInfo      = dptest.LogTCPInfo
	linkRx          = dptest.LinkRx
	untilMeasured   = dptest.UntilMeasured
	skbCtx          = dptest.SKBCtx
	traceDrops      = dptest.TraceDrops
	lossDelta       = dptest.LossDelta
	netStats        = dptest.NetStats
	procCounters    = dptest.ProcCounters
	snmpCounter     = dptest.SNMPCounter
	htons           = dptest.Htons
	linkMAC         = dptest.LinkMAC
	udpEcho         = dptest.UDPEcho
	sendRaw         = dptest.SendRaw
)

type (
	nsCfg     = dptest.NSCfg
	skbFields = dptest.SKBFields
	edtRun    = dptest.EDTRun
)

const (
	tcActOK       = dptest.TCActOK
	tcActShot     = dptest.TCActShot
	tcActRedirect = dptest.TCActRedirect
	skbOffIfindex = dptest.SKBOffIfindex
	bigTCPSize    = dptest.BigTCPSize
	bigTSOSegs    = dptest.BigTSOSegs
)
