// Command workload is the real node's training stand-in and the process oracle's writer.
//
// While it runs it appends one line per tick to a file on a hostPath mount, naming the execution it
// belongs to (job id, submission and admission number A, from the variables the dispatch downward API
// sets), its pod, its pid and the time. Tests read that file afterwards: two executions of one submission
// alive at once show up as two A values whose lines interleave, whatever the pod objects said.
//
// Every line is one write(2) on a file opened with O_APPEND, so the processes of several pods can share
// one file without tearing each other's lines.
//
// Environment (all optional):
//
//	ORACLE_FILE  where to append (default /oracle/oracle.log; its directory is created)
//	TICK         time between TICK lines (default 100ms)
//	GRACE        after SIGTERM, keep ticking this long, then exit (default 0)
//	LINGER=1     ignore SIGTERM (write TERM, keep ticking until killed)
//	EXIT_CODE    the exit status on leaving by itself or after GRACE (default 0)
//	LIFETIME     leave by itself after this long (default: never)
//	DISPATCH_JOB_ID, DISPATCH_SUBMISSION, DISPATCH_ADMISSION, POD_NAME  copied into every line
//
// Durations are Go durations ("250ms", "2s") or plain numbers of seconds. Arguments are ignored, so a
// runtime that passes a command and arguments of its own still starts this program (the image also
// installs it under the names such commands use).
package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type oracle struct {
	f      *os.File
	prefix string // the fields every line repeats
	seq    int
}

// line writes one record in a single write(2); a failed write is reported but the process lives on,
// because a process that vanished on a full disk would look like a clean stop to the reader.
func (o *oracle) line(event string, extra string) {
	o.seq++
	text := fmt.Sprintf("%s seq=%d ms=%d event=%s%s\n", o.prefix, o.seq, time.Now().UnixMilli(), event, extra)
	if _, err := o.f.Write([]byte(text)); err != nil {
		fmt.Fprintf(os.Stderr, "workload: write %s: %v\n", o.f.Name(), err)
	}
	if event != "TICK" {
		fmt.Print(text)
	}
}

// field escapes a value so that a line always splits on spaces and '=' into its fields.
func field(v string) string {
	if v == "" {
		return "-"
	}
	r := strings.NewReplacer("%", "%25", " ", "%20", "=", "%3D", "\n", "%0A", "\t", "%09")
	return r.Replace(v)
}

func duration(name string, def time.Duration) time.Duration {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return def
	}
	if secs, err := strconv.ParseFloat(v, 64); err == nil {
		return time.Duration(secs * float64(time.Second))
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "workload: %s=%q is not a duration; using %s\n", name, v, def)
		return def
	}
	return d
}

// startTicks is the process's start time in clock ticks since boot (/proc/self/stat field 22): with the
// pid it names this process and no later one that reuses the pid.
func startTicks() string {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return "-"
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return "-"
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return "-"
	}
	return f[19]
}

// pidNamespace names the pid namespace the pid belongs to ("4026531836"), so a reader knows whether
// the pid is one it can look up on the host (a pod with hostPID) or only inside the container.
func pidNamespace() string {
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return "-"
	}
	return strings.TrimSuffix(strings.TrimPrefix(link, "pid:["), "]")
}

func runID() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return strconv.FormatInt(time.Now().UnixNano(), 16)
	}
	return hex.EncodeToString(b)
}

func main() {
	path := os.Getenv("ORACLE_FILE")
	if path == "" {
		path = "/oracle/oracle.log"
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(2)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(2) // no oracle, no point: fail where the test can see it
	}
	o := &oracle{f: f, prefix: fmt.Sprintf(
		"dispatch-oracle/1 job=%s submission=%s a=%s pod=%s pid=%d pidns=%s start=%s run=%s",
		field(os.Getenv("DISPATCH_JOB_ID")), field(os.Getenv("DISPATCH_SUBMISSION")),
		field(os.Getenv("DISPATCH_ADMISSION")), field(os.Getenv("POD_NAME")), os.Getpid(), pidNamespace(),
		startTicks(), runID())}

	tick := duration("TICK", 100*time.Millisecond)
	if tick <= 0 {
		tick = 100 * time.Millisecond
	}
	grace := duration("GRACE", 0)
	lifetime := duration("LIFETIME", 0)
	linger := os.Getenv("LINGER") == "1"
	code, err := strconv.Atoi(strings.TrimSpace(os.Getenv("EXIT_CODE")))
	if err != nil {
		code = 0
	}

	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	o.line("START", " cmd="+field(filepath.Base(os.Args[0])))

	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	var end <-chan time.Time // closes the process: its lifetime, or its grace after SIGTERM
	if lifetime > 0 {
		end = time.After(lifetime)
	}
	termed := false
	for {
		select {
		case <-ticker.C:
			o.line("TICK", "")
		case s := <-signals:
			o.line("TERM", " signal="+field(s.String()))
			if linger || termed {
				continue // a lingering process outlives its grace period; it ends only by SIGKILL
			}
			termed = true
			end = time.After(grace)
		case <-end:
			o.line("EXIT", " code="+strconv.Itoa(code))
			_ = f.Close()
			os.Exit(code)
		}
	}
}
