// Command lines of pstar-plan and pstar-run through CLI11: a help text that
// starts with the tool's own usage line, and one way to answer a bad
// command line (the tool's name and the message, a blank line and the help,
// on stderr; exit status 2) or --help (the help on stdout; exit status 0).
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace pstar::tools {

// A value CLI11 accepted but the tool does not (a unit, a range); the
// message names the option.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// CLI11's help with the tool's usage line first, then the app's description,
// then the option groups (one blank line apart) and the footer.
class UsageFormatter : public CLI::Formatter {
 public:
  explicit UsageFormatter(std::string usage) : usage_(std::move(usage)) { column_width(38); }
  std::string make_description(const CLI::App*) const override { return {}; }
  std::string make_usage(const CLI::App* app, std::string) const override {
    const std::string d = app->get_description();
    return usage_ + "\n" + (d.empty() ? "" : "\n" + d + "\n");
  }
  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    std::string help = CLI::Formatter::make_help(app, std::move(name), mode);
    for (size_t at; (at = help.find("\n\n\n")) != std::string::npos;) help.erase(at, 1);
    return help;
  }

 private:
  std::string usage_;
};

// The settings both tools share: the usage line, and a repeated option's
// last value wins (as `--batch 4 --batch 2` always did).
inline void configure(CLI::App& app, std::string usage) {
  app.formatter(std::make_shared<UsageFormatter>(std::move(usage)));
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

// CLI11 reads "--name=" as "--name" and takes the next argument as its
// value; the tools have always read it as an empty value, which none of
// their options accepts.  Checks the options in [begin, end), up to "--".
inline void reject_empty_values(char** begin, char** end) {
  for (char** arg = begin; arg != end; ++arg) {
    const std::string a = *arg;
    if (a == "--") return;
    if (a.size() > 3 && a.compare(0, 2, "--") == 0 && a.find('=') == a.size() - 1)
      throw UsageError(a.substr(0, a.size() - 1) + " needs a non-empty value");
  }
}

[[noreturn]] inline void usage_exit(const CLI::App& app, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n\n%s", app.get_name().c_str(), message.c_str(), app.help().c_str());
  std::exit(2);
}

// Parses the command line into `app` (whose option callbacks may throw
// UsageError), then runs `finish` (checks across options; may throw it too).
template <class Finish>
void parse_or_exit(CLI::App& app, int argc, char** argv, Finish&& finish) {
  try {
    app.parse(argc, argv);
    finish();
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    std::exit(0);
  } catch (const CLI::ExtrasError&) {
    // What CLI11 did not take, named as the tools always named it.
    const std::vector<std::string> rest = app.remaining();
    const auto option =
        std::find_if(rest.begin(), rest.end(), [](const std::string& a) { return a.size() > 1 && a[0] == '-'; });
    usage_exit(app,
               option != rest.end() ? "unknown option '" + *option + "'" : "unexpected argument '" + rest.at(0) + "'");
  } catch (const CLI::ParseError& e) {
    usage_exit(app, e.what());
  } catch (const UsageError& e) {
    usage_exit(app, e.what());
  }
}

}  // namespace pstar::tools
