#include "tools/cli.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lbcc::cli {
namespace {

// How a flag is spelled back to the user: -b for one-letter flags, --name otherwise.
std::string Spelled(absl::string_view name) {
  return name.size() == 1 ? absl::StrCat("-", name) : absl::StrCat("--", name);
}

}  // namespace

absl::StatusOr<Parsed> Parse(int argc, char** argv) {
  Parsed parsed;
  bool flags_done = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (flags_done || arg.size() < 2 || arg[0] != '-') {
      parsed.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      flags_done = true;
      continue;
    }
    const bool double_dash = absl::StartsWith(arg, "--");
    absl::string_view body = arg.substr(double_dash ? 2 : 1);
    if (body == "h" || body == "help") {
      parsed.help = true;
      continue;
    }
    absl::string_view name = body;
    absl::string_view value;
    bool has_value = false;
    const size_t eq = body.find('=');
    if (eq != absl::string_view::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    // -b8: a one-letter flag with its value attached (getopt style), when no flag has the
    // whole name.
    if (flag == nullptr && !double_dash && !has_value && body.size() > 1) {
      absl::CommandLineFlag* letter = absl::FindCommandLineFlag(body.substr(0, 1));
      if (letter != nullptr && !letter->IsOfType<bool>()) {
        flag = letter;
        name = body.substr(0, 1);
        value = body.substr(1);
        has_value = true;
      }
    }
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no") && !has_value) {
      absl::CommandLineFlag* positive = absl::FindCommandLineFlag(name.substr(2));
      if (positive != nullptr && positive->IsOfType<bool>()) {
        flag = positive;
        name = name.substr(2);
        negated = true;
      }
    }
    if (flag == nullptr || flag->IsRetired()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", arg));
    }
    std::string text;
    if (negated) {
      text = "false";
    } else if (has_value) {
      text = std::string(value);
    } else if (flag->IsOfType<bool>()) {
      text = "true";
    } else if (i + 1 < argc) {
      text = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(Spelled(name), " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(text, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Spelled(name), ": bad value '", text, "' (", error, ")"));
    }
    parsed.given.insert(std::string(name));
  }
  return parsed;
}

std::string Help(absl::string_view usage, absl::string_view flags_file) {
  std::string out(usage);
  if (!out.empty() && out.back() != '\n') out += '\n';
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (!flag->IsRetired() && absl::EndsWith(flag->Filename(), flags_file)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(), [](absl::CommandLineFlag* a, absl::CommandLineFlag* b) {
    return a->Name() < b->Name();
  });
  if (!flags.empty()) out += "\nflags:\n";
  for (absl::CommandLineFlag* flag : flags) {
    const std::string lead =
        absl::StrCat("  ", Spelled(flag->Name()), " (default '", flag->DefaultValue(), "')");
    absl::StrAppendFormat(&out, "%s\n      %s\n", lead, flag->Help());
  }
  return out;
}

Parsed ParseOrExit(int argc, char** argv, absl::string_view usage, absl::string_view flags_file) {
  absl::StatusOr<Parsed> parsed = Parse(argc, argv);
  const char* program = argc > 0 ? argv[0] : "lbcc";
  if (const char* slash = std::strrchr(program, '/')) program = slash + 1;
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s: %s (see --help)\n", program,
                 std::string(parsed.status().message()).c_str());
    std::exit(2);
  }
  if (parsed->help) {
    std::fputs(Help(usage, flags_file).c_str(), stdout);
    std::exit(0);
  }
  return *std::move(parsed);
}

}  // namespace lbcc::cli
