// A TCP key-value store for rendezvous, after torch.distributed.TCPStore.
//
// One process (rank 0, or the launcher's agent) runs the server: it listens
// on every IPv4 interface at `port` (0: any free port, see port()). Every
// process, the server's included, talks to it through one client connection.
// Clients connect with retries until the timeout, so ranks may start in any
// order. Every call that waits has a deadline and throws kiln::Error naming
// the keys, the address and the timeout when it passes; a closed connection
// (the server's process died) throws at once. Thread-safe: calls on one store
// are serialized.
//
// The Gloo backend reaches this store through an adapter implementing
// gloo::rendezvous::Store (core/distributed/gloo_backend.cpp), so this header
// does not include Gloo; the NCCL backend exchanges its unique id here too.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kiln::distributed {

class TCPStore {
 public:
  // Throws kiln::Error when the server cannot listen (port taken), a client
  // cannot connect within `timeout`, or `timeout` is not positive.
  TCPStore(std::string host, int port, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::seconds(30));
  ~TCPStore();
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  void set(const std::string& key, const std::string& value);
  // Waits until `key` exists (up to the store's timeout), then returns its value.
  std::vector<char> get(const std::string& key);
  std::string get_string(const std::string& key);
  // Adds `delta` to the integer under `key` (absent: 0) and returns the new value;
  // kiln::Error when the key holds something else or the sum overflows 64 bits.
  int64_t add(const std::string& key, int64_t delta);
  // Whether every key exists now (no waiting).
  bool check(const std::vector<std::string>& keys);
  // Waits until every key exists; throws kiln::Error after `timeout`.
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  // The port the server listens on (the chosen one when constructed with 0).
  int port() const { return port_; }
  const std::string& host() const { return host_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  bool is_server() const { return server_ != nullptr; }

 private:
  struct Server;
  // Sends `message` and reads the status byte plus a tail of `tail_bytes`
  // (-1: a u64 length, then that many bytes); throws on a lost connection.
  std::vector<char> request(const std::vector<char>& message, const char* what, const std::string& keys,
                            std::chrono::milliseconds wait_budget, int64_t tail_bytes, uint8_t* status);

  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Server> server_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace kiln::distributed
