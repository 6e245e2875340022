// StatusError: a Status thrown where no Status can be returned (a constructor, a backend
// allocation deep inside one); the first caller that can return a Status catches it and
// returns status().
#pragma once

#include <stdexcept>
#include <utility>

#include "oasis/status.h"

namespace oasis {

class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status status)
      : std::runtime_error(status.ToString()), status_(std::move(status)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

}  // namespace oasis
