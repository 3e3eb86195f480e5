// TCPStore: a small request/reply protocol over one TCP connection per client.
//   request: u8 op | u32 key count | keys (u32 length + bytes) | op-specific tail
//   reply:   u8 status (0 ok, 1 timed out, 2 not an integer) | op-specific tail
// The server runs one thread per connection: a blocking GET or WAIT sleeps on
// a condition variable until the key appears or the client's deadline passes.
#include "core/distributed/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>

#include "kernels/error.h"

namespace kiln::distributed {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5 };
enum Status : uint8_t { kOk = 0, kTimedOut = 1, kNotInteger = 2 };

void put_bytes(std::vector<char>& out, const void* data, size_t n) {
  if (n == 0) return;
  // resize + memcpy: GCC 12 reports a false -Wstringop-overflow for vector::insert here.
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, data, n);
}
template <typename T>
void put(std::vector<char>& out, T value) {
  put_bytes(out, &value, sizeof(T));
}
void put_string(std::vector<char>& out, const std::string& s) {
  put(out, static_cast<uint32_t>(s.size()));
  put_bytes(out, s.data(), s.size());
}

std::string join_keys(const std::vector<std::string>& keys) {
  std::string text = "[";
  for (size_t i = 0; i < keys.size(); ++i) text += (i ? ", " : "") + keys[i];
  return text + "]";
}

// Sends everything; false when the peer is gone.
bool send_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t sent = ::send(fd, data, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

// Reads exactly n bytes. Returns 1 on success, 0 on a closed connection,
// -1 when the deadline (if any) passed.
int recv_all(int fd, char* data, size_t n, const Clock::time_point* deadline) {
  while (n > 0) {
    if (deadline) {
      const auto left = std::chrono::duration_cast<milliseconds>(*deadline - Clock::now()).count();
      if (left <= 0) return -1;
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (ready < 0 && errno != EINTR) return 0;
      if (ready <= 0) continue;
    }
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return 0;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return 1;
}

template <typename T>
bool read_value(int fd, T* value) {
  return recv_all(fd, reinterpret_cast<char*>(value), sizeof(T), nullptr) == 1;
}
bool read_string(int fd, std::string* s) {
  uint32_t n = 0;
  if (!read_value(fd, &n)) return false;
  s->resize(n);
  return n == 0 || recv_all(fd, s->data(), n, nullptr) == 1;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

// ---------------------------------------------------------------- server

struct TCPStore::Server {
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  std::thread acceptor;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::vector<char>> data;
  bool stopping = false;
  std::vector<std::thread> connections;
  std::vector<int> connection_fds;

  explicit Server(int port) {
    listen_fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    KILN_CHECK(listen_fd >= 0, "TCPStore: socket() failed: ", errno_text());
    const int one = 1;
    ::setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        ::listen(listen_fd, 1024) != 0) {
      const std::string why = errno_text();
      ::close(listen_fd);
      KILN_THROW("TCPStore: cannot listen on port ", port, ": ", why,
                 " (is another job using MASTER_PORT? pick another port)");
    }
    KILN_CHECK(::pipe2(wake, O_CLOEXEC) == 0, "TCPStore: pipe2() failed: ", errno_text());
    acceptor = std::thread([this] { accept_loop(); });
  }

  int bound_port() const {
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    ::getsockname(listen_fd, reinterpret_cast<sockaddr*>(&address), &length);
    return ntohs(address.sin_port);
  }

  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
      for (int fd : connection_fds) ::shutdown(fd, SHUT_RDWR);
    }
    changed.notify_all();
    const char byte = 0;
    [[maybe_unused]] const ssize_t ignored = ::write(wake[1], &byte, 1);
    acceptor.join();
    for (auto& thread : connections) thread.join();
    for (int fd : connection_fds) ::close(fd);
    ::close(listen_fd);
    ::close(wake[0]);
    ::close(wake[1]);
  }

  void accept_loop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[1].revents) return;
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) {
        ::close(fd);
        return;
      }
      connection_fds.push_back(fd);
      connections.emplace_back([this, fd] { serve(fd); });
    }
  }

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data.count(k) > 0; });
  }

  // Serves one client until it disconnects or the server stops.
  void serve(int fd) {
    for (;;) {
      uint8_t op = 0;
      uint32_t count = 0;
      if (!read_value(fd, &op) || !read_value(fd, &count)) return;
      std::vector<std::string> keys(count);
      for (auto& key : keys)
        if (!read_string(fd, &key)) return;
      std::vector<char> reply;
      if (op == kSet) {
        uint64_t n = 0;
        if (!read_value(fd, &n)) return;
        std::vector<char> value(n);
        if (n && recv_all(fd, value.data(), n, nullptr) != 1) return;
        {
          std::lock_guard<std::mutex> lock(mutex);
          data[keys.at(0)] = std::move(value);
        }
        changed.notify_all();
        put(reply, kOk);
      } else if (op == kAdd) {
        int64_t delta = 0;
        if (!read_value(fd, &delta)) return;
        int64_t result = 0;
        bool integer = true;  // a value set() as text that is no integer (or a sum that overflows) is refused
        {
          std::lock_guard<std::mutex> lock(mutex);
          auto& slot = data[keys.at(0)];
          if (!slot.empty()) {
            const auto [end, error] = std::from_chars(slot.data(), slot.data() + slot.size(), result);
            integer = error == std::errc() && end == slot.data() + slot.size();
          }
          integer = integer && !__builtin_add_overflow(result, delta, &result);
          if (integer) {
            const std::string text = std::to_string(result);
            slot.assign(text.begin(), text.end());
          }
        }
        if (integer) changed.notify_all();
        put(reply, integer ? kOk : kNotInteger);
        put(reply, integer ? result : int64_t{0});
      } else if (op == kCheck) {
        std::lock_guard<std::mutex> lock(mutex);
        put(reply, kOk);
        put(reply, static_cast<uint8_t>(has_all(keys)));
      } else if (op == kGet || op == kWait) {
        uint64_t timeout_ms = 0;
        if (!read_value(fd, &timeout_ms)) return;
        const auto deadline = Clock::now() + milliseconds(timeout_ms);
        std::unique_lock<std::mutex> lock(mutex);
        const bool ready = changed.wait_until(lock, deadline, [&] { return stopping || has_all(keys); });
        if (stopping) return;
        put(reply, ready ? kOk : kTimedOut);
        if (op == kGet) {
          const std::vector<char> empty;
          const std::vector<char>& value = ready ? data[keys.at(0)] : empty;
          put(reply, static_cast<uint64_t>(value.size()));
          put_bytes(reply, value.data(), value.size());
        }
      } else {
        return;  // unknown request: drop the connection
      }
      if (!send_all(fd, reply.data(), reply.size())) return;
    }
  }
};

// ---------------------------------------------------------------- client

namespace {

// Connects to host:port, retrying until `deadline`; returns the socket.
int connect_with_retries(const std::string& host, int port, Clock::time_point deadline, milliseconds timeout) {
  std::string last_error = "no attempt";
  auto backoff = milliseconds(10);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
    if (rc != 0) {
      last_error = std::string("cannot resolve host: ") + gai_strerror(rc);
    } else {
      for (addrinfo* a = found; a; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int result = ::connect(fd, a->ai_addr, a->ai_addrlen);
        if (result != 0 && errno == EINPROGRESS) {
          const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
          pollfd p{fd, POLLOUT, 0};
          int error = ETIMEDOUT;
          if (::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left, 1, 1000))) > 0) {
            socklen_t length = sizeof(error);
            ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length);
          }
          result = error == 0 ? 0 : -1;
          errno = error;
        }
        if (result == 0) {
          ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          ::freeaddrinfo(found);
          return fd;
        }
        last_error = errno_text();
        ::close(fd);
      }
      ::freeaddrinfo(found);
    }
    if (Clock::now() + backoff >= deadline) {
      KILN_THROW("TCPStore: could not connect to ", host, ":", port, " within ", timeout.count(),
                 " ms (last error: ", last_error, "); is rank 0 (or the launcher) running at MASTER_ADDR:MASTER_PORT?");
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(250));
  }
}

std::vector<char> request_header(Op op, const std::vector<std::string>& keys) {
  std::vector<char> message;
  put(message, static_cast<uint8_t>(op));
  put(message, static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) put_string(message, key);
  return message;
}

}  // namespace

TCPStore::TCPStore(std::string host, int port, bool is_server, milliseconds timeout)
    : host_(std::move(host)), port_(port), timeout_(timeout) {
  KILN_CHECK(port >= 0 && port < 65536, "TCPStore: port ", port, " is out of range [0, 65535]");
  KILN_CHECK(is_server || port > 0, "TCPStore: a client needs the server's port (got 0)");
  KILN_CHECK(timeout.count() > 0, "TCPStore: the timeout must be positive, got ", timeout.count(), " ms");
  if (is_server) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->bound_port();
  }
  fd_ = connect_with_retries(is_server ? std::string("127.0.0.1") : host_, port_, Clock::now() + timeout_, timeout_);
}

TCPStore::~TCPStore() {
  if (fd_ >= 0) ::close(fd_);
  server_.reset();
}

std::vector<char> TCPStore::request(const std::vector<char>& message, const char* what, const std::string& keys,
                                   milliseconds wait_budget, int64_t tail_bytes, uint8_t* status) {
  std::lock_guard<std::mutex> lock(mutex_);
  KILN_CHECK(fd_ >= 0, "TCPStore::", what, ": the connection to ", host_, ":", port_,
             " was lost in an earlier call");
  auto fail = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    KILN_THROW("TCPStore::", what, "(", keys, ") at ", host_, ":", port_, ": ", why);
  };
  if (!send_all(fd_, message.data(), message.size())) fail("the store closed the connection (did rank 0 exit?)");
  // The server answers by the deadline it was given; allow a margin for a slow network.
  const auto deadline = Clock::now() + wait_budget + timeout_;
  const int rc = recv_all(fd_, reinterpret_cast<char*>(status), 1, &deadline);
  if (rc == 0) fail("the store closed the connection (did rank 0 exit?)");
  if (rc < 0) fail("no reply from the store within " + std::to_string((wait_budget + timeout_).count()) + " ms");
  uint64_t n = static_cast<uint64_t>(tail_bytes);
  if (tail_bytes < 0 && recv_all(fd_, reinterpret_cast<char*>(&n), sizeof(n), &deadline) != 1) fail("truncated reply");
  std::vector<char> tail(n);
  if (n && recv_all(fd_, tail.data(), n, &deadline) != 1) fail("truncated reply");
  return tail;
}

void TCPStore::set(const std::string& key, const std::vector<char>& value) {
  auto message = request_header(kSet, {key});
  put(message, static_cast<uint64_t>(value.size()));
  put_bytes(message, value.data(), value.size());
  uint8_t status = 0;
  request(message, "set", key, milliseconds(0), 0, &status);
}

void TCPStore::set(const std::string& key, const std::string& value) {
  set(key, std::vector<char>(value.begin(), value.end()));
}

std::vector<char> TCPStore::get(const std::string& key) {
  auto message = request_header(kGet, {key});
  put(message, static_cast<uint64_t>(timeout_.count()));
  uint8_t status = 0;
  std::vector<char> value = request(message, "get", key, timeout_, -1, &status);
  KILN_CHECK(status == kOk, "TCPStore::get: timed out after ", timeout_.count(), " ms waiting for key '", key,
             "' at ", host_, ":", port_, " (a rank did not arrive: did it fail or start late?)");
  return value;
}

std::string TCPStore::get_string(const std::string& key) {
  const auto value = get(key);
  return std::string(value.begin(), value.end());
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  auto message = request_header(kAdd, {key});
  put(message, delta);
  uint8_t status = 0;
  const auto tail = request(message, "add", key, milliseconds(0), sizeof(int64_t), &status);
  KILN_CHECK(status == kOk, "TCPStore::add: key '", key, "' at ", host_, ":", port_,
             " holds a value that is not an integer, or adding ", delta, " to it overflows 64 bits");
  int64_t result = 0;
  std::memcpy(&result, tail.data(), sizeof(result));
  return result;
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  uint8_t status = 0;
  const auto tail = request(request_header(kCheck, keys), "check", join_keys(keys), milliseconds(0), 1, &status);
  return tail[0] != 0;
}

void TCPStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TCPStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  auto message = request_header(kWait, keys);
  put(message, static_cast<uint64_t>(timeout.count()));
  uint8_t status = 0;
  request(message, "wait", join_keys(keys), timeout, 0, &status);
  KILN_CHECK(status == kOk, "TCPStore::wait: timed out after ", timeout.count(), " ms waiting for keys ",
             join_keys(keys), " at ", host_, ":", port_, " (a rank did not arrive: did it fail or start late?)");
}

}  // namespace kiln::distributed
