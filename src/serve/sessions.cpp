// sae-serve's sessions (server_parts.h): a WebSocket client's queue of messages, and an HTTP
// connection from its first header (the token, the limits) to its response.
#include "saetrain/error.h"
#include "server_parts.h"

namespace saetrain::serve {

// ---- WsSession ---------------------------------------------------------------------------------

WsSession::~WsSession() {
    server_.ws_queued() -= std::min(server_.ws_queued(), out_bytes_);
    server_.connection_closed();
    server_.unsubscribe(this);
}

void WsSession::start(Request req) {
    // A client gone without a close (a laptop's tunnel dropped) is noticed by a ping unanswered
    // within two minutes, not at the next write.
    websocket::stream_base::timeout timeouts =
        websocket::stream_base::timeout::suggested(beast::role_type::server);
    timeouts.idle_timeout = std::chrono::seconds(120);
    timeouts.keep_alive_pings = true;
    ws_.set_option(timeouts);
    ws_.set_option(websocket::stream_base::decorator(
        [](websocket::response_type& res) { res.set(http::field::server, "sae-serve"); }));
    ws_.read_message_max(64 << 10);
    // A client's close frame: stop writing at once, so that Beast can answer it (its close reply
    // waits for our write in progress) instead of the client waiting out its close timeout.
    ws_.control_callback([this](websocket::frame_type kind, beast::string_view) {
        if (kind == websocket::frame_type::close) {
            closed_ = true;
            // What stays queued is the write in progress, if any.
            size_t keep = writing_ && !out_.empty() ? out_.front()->size() : 0;
            if (out_.size() > 1) out_.erase(out_.begin() + 1, out_.end());
            if (!writing_) out_.clear();
            keep = std::min(keep, out_bytes_);
            server_.ws_queued() -= std::min(server_.ws_queued(), out_bytes_ - keep);
            out_bytes_ = keep;
        }
    });
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code ec) {
        if (ec) return;
        self->server_.subscribe(self);
        self->do_read();
    });
}

void WsSession::send(std::shared_ptr<const std::string> msg) {
    if (closed_) return;
    if (out_bytes_ + msg->size() > kMaxQueuedBytes ||
        server_.ws_queued() + msg->size() > kMaxQueuedTotal) {
        // Too slow to keep up: dropped; it reconnects with since=STEP and loses nothing.
        close();
        return;
    }
    out_bytes_ += msg->size();
    server_.ws_queued() += msg->size();
    out_.push_back(std::move(msg));
    if (!writing_) write_next();
}

void WsSession::send_step(int64_t step, std::shared_ptr<const std::string> msg) {
    if (step <= since_) return;
    since_ = step;
    send(std::move(msg));
}

void WsSession::rewind(int64_t step, std::shared_ptr<const std::string> msg) {
    since_ = std::min(since_, step);
    send(std::move(msg));
}

void WsSession::write_next() {
    writing_ = true;
    ws_.text(true);
    ws_.async_write(net::buffer(*out_.front()),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                        const size_t n = std::min(self->out_bytes_, self->out_.front()->size());
                        self->out_bytes_ -= n;
                        self->server_.ws_queued() -= std::min(self->server_.ws_queued(), n);
                        self->out_.pop_front();
                        if (ec) {
                            self->closed_ = true;
                            self->server_.unsubscribe(self.get());
                            return;
                        }
                        if (!self->out_.empty() && !self->closed_)
                            self->write_next();
                        else
                            self->writing_ = false;
                    });
}

void WsSession::do_read() {
    // Clients send nothing the server needs; reading notices their close.
    ws_.async_read(in_, [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) {
            self->closed_ = true;
            self->server_.unsubscribe(self.get());
            return;
        }
        self->in_.consume(self->in_.size());
        self->do_read();
    });
}

void WsSession::close() {
    if (closed_) return;
    closed_ = true;
    server_.unsubscribe(this);
    ws_.async_close(websocket::close_reason(websocket::close_code::policy_error,
                                            "too slow: reconnect with since=STEP"),
                    [self = shared_from_this()](beast::error_code) {});
}

// ---- HttpSession -------------------------------------------------------------------------------

HttpSession::~HttpSession() { server_.connection_closed(); }

void HttpSession::evict() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
        beast::error_code ec;
        self->stream_.socket().close(ec);
    });
}

void HttpSession::read_header() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    // No limit while the header is read: the token is checked before the body's size, so that a
    // client without it learns nothing but 401.
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stream_.expires_after(trusted_ ? kReadTimeout : kFirstHeaderTimeout);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void HttpSession::on_header(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::eof)
        return;
    Request bad;
    bad.version(11);
    bad.keep_alive(false);
    if (ec == http::error::header_limit)
        return send(
            error_response(bad, http::status::request_header_fields_too_large,
                           fmt::format("the request's header is over {} bytes", kHeaderLimit)),
            true);
    if (ec == http::error::body_limit) return send(body_over_limit(bad), true);
    if (ec) return send(error_response(bad, http::status::bad_request, ec.message()), true);
    if (auto refused = server_.check_header(parser_->get())) return send(std::move(*refused), true);
    trusted_ = true;
    if (const auto length = parser_->content_length(); length && *length > server_.max_body())
        return send(error_response(parser_->get(), http::status::payload_too_large,
                                   fmt::format("the request body ({} bytes) is over sae-serve's "
                                               "limit of {} bytes (--max-body)",
                                               *length, server_.max_body())),
                    true);
    parser_->body_limit(server_.max_body());  // a chunked body is counted as it comes
    if (parser_->is_done()) return dispatch();
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
        // curl waits a second for this before it sends a body over 1 KiB.
        auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                       parser_->get().version());
        return http::async_write(stream_, *cont,
                                 [self = shared_from_this(), cont](beast::error_code e, size_t) {
                                     if (!e) self->read_body();
                                 });
    }
    read_body();
}

Response HttpSession::body_over_limit(const Request& req) const {
    return error_response(req, http::status::payload_too_large,
                          fmt::format("the request body is over sae-serve's limit of {} bytes "
                                      "(--max-body)",
                                      server_.max_body()));
}

void HttpSession::read_body() {
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code e, size_t) { self->on_body(e); });
}

void HttpSession::on_body(beast::error_code ec) {
    Request bad;
    bad.version(11);
    bad.keep_alive(false);
    if (ec == http::error::body_limit) return send(body_over_limit(bad), true);
    if (ec) return;
    dispatch();
}

void HttpSession::dispatch() {
    Request req = parser_->release();
    // The answer may come later (a report being made): the callback keeps the session.
    server_.handle(std::move(req), &stream_,
                   [self = shared_from_this()](Response res) { self->send(std::move(res)); });
}

void HttpSession::send(Response res, bool then_close) {
    auto sp = std::make_shared<Response>(std::move(res));
    const bool close = then_close || sp->need_eof();
    if (close) sp->keep_alive(false);
    stream_.expires_after(kReadTimeout);
    http::async_write(stream_, *sp,
                      [self = shared_from_this(), sp, close](beast::error_code ec, size_t) {
                          if (ec) return;
                          if (close) return self->drain_and_close();
                          self->read_header();
                      });
}

// After an answer that ends the connection before its body was read (401, 413): stop sending,
// then read and drop what the client still sends (up to 64 MiB or 10 s), so that it reads the
// answer instead of a connection reset.
void HttpSession::drain_and_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (drained_ > (64 << 20)) return;
    stream_.expires_after(std::chrono::seconds(10));
    stream_.async_read_some(net::buffer(drain_),
                            [self = shared_from_this()](beast::error_code e, size_t n) {
                                if (e) return;
                                self->drained_ += n;
                                self->drain_and_close();
                            });
}

}  // namespace saetrain::serve
