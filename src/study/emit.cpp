#include "study/emit.h"

#include <set>
#include <sstream>

#include "scaling/rule.h"
#include "study/text.h"

namespace proplab::study_detail {

std::string resolved_toml(const std::vector<TableSpec>& schema, const Study& study, const toml::table* sweep) {
  std::ostringstream out;
  out << "# proplab study, resolved: every default filled in\n";
  const auto write_fields = [&](const TableSpec& spec) {
    std::string lines;
    std::set<std::string> written;
    for (const Field& field : spec.fields) {
      if ((field.applies && !field.applies(study)) || (field.present && !field.present(study)) ||
          !written.insert(field.key).second)
        continue;
      lines += field.key + " = " + field.write(study) + "\n";
    }
    return lines;
  };
  for (const TableSpec& spec : schema) {
    const std::string lines = write_fields(spec);
    // A table of optional keys none of which is set ([theory]) is left out.
    if (!spec.name.empty() && !lines.empty()) out << "\n[" << spec.name << "]\n";
    out << lines;
    if (spec.name != "model") continue;
    out << "\n[scaling]\nrule = " << toml_string(study.scaling.rule) << "\n";
    if (const RuleInfo* info = find_rule(study.scaling.rule))
      for (const RuleParamDoc& doc : info->params)
        out << doc.key << " = " << toml_float(study.scaling.params.at(doc.key)) << "\n";
  }
  if (sweep) {
    toml::table wrapper;
    wrapper.insert("sweep", *sweep);
    out << "\n" << wrapper << "\n";
  }
  return out.str();
}

}  // namespace proplab::study_detail
