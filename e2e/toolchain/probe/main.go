// Command probe is the single static binary of the test images sluice builds locally: it prints,
// resolves names, serves and fetches HTTP, so tests can check pods, DNS and Services without a registry.
package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

const usage = `usage:
  probe echo WORDS...     print WORDS to stdout and exit
  probe lookup NAME       print the addresses NAME resolves to
  probe serve PORT TEXT   answer every HTTP request on PORT with TEXT
  probe get URL           print the body of an HTTP GET (retrying for up to 60s)
  probe dial HOST:PORT    open a TCP connection and print "connected"`

func main() {
	if len(os.Args) < 2 {
		fail(usage)
	}
	args := os.Args[2:]
	switch os.Args[1] {
	case "echo":
		fmt.Println(strings.Join(args, " "))
	case "lookup":
		need(args, 1)
		addrs, err := net.LookupHost(args[0])
		if err != nil {
			fail(err.Error())
		}
		fmt.Println(strings.Join(addrs, " "))
	case "serve":
		need(args, 2)
		serve(args[0], args[1])
	case "get":
		need(args, 1)
		get(args[0])
	case "dial":
		need(args, 1)
		conn, err := net.DialTimeout("tcp", args[0], 10*time.Second)
		if err != nil {
			fail(err.Error())
		}
		conn.Close()
		fmt.Println("connected")
	default:
		fail(usage)
	}
}

func serve(port, text string) {
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, text) })
	fmt.Printf("serving on :%s\n", port)
	fail(http.ListenAndServe(":"+port, nil).Error())
}

func get(url string) {
	client := http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		body, err := fetch(&client, url)
		if err == nil {
			fmt.Print(body)
			return
		}
		if time.Now().After(deadline) {
			fail(err.Error())
		}
		fmt.Fprintln(os.Stderr, "retrying:", err)
		time.Sleep(time.Second)
	}
}

func fetch(client *http.Client, url string) (string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", url, resp.Status)
	}
	return string(body), nil
}

func need(args []string, n int) {
	if len(args) < n {
		fail(usage)
	}
}

func fail(message string) {
	fmt.Fprintln(os.Stderr, message)
	os.Exit(1)
}
