#include "trainer/training_curves.h"

namespace kiln {

namespace {

enum class Panel { none, loss, accuracy, learning_rate };

Panel panel_of(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (name.rfind("lr-", 0) == 0 || name == "lr") {
    // LearningRateMonitor's extra values are not learning rates.
    return ends_with("-momentum") || ends_with("-weight_decay") ? Panel::none : Panel::learning_rate;
  }
  if (name.find("loss") != std::string::npos) return Panel::loss;
  if (name.find("acc") != std::string::npos) return Panel::accuracy;
  return Panel::none;
}

}  // namespace

void TrainingCurves::record(const std::map<std::string, double>& metrics, int64_t step) {
  for (const auto& [name, value] : metrics) {
    if (panel_of(name) == Panel::none) continue;
    PlotSeries& series = series_[name];
    series.name = name;
    series.x.push_back(static_cast<double>(step));
    series.y.push_back(value);
  }
}

std::vector<PlotPanel> TrainingCurves::panels() const {
  std::vector<PlotPanel> panels(3);
  panels[0] = {"Loss", "step", "loss", {}, false};
  panels[1] = {"Accuracy", "step", "accuracy", {}, false};
  panels[2] = {"Learning rate", "step", "learning rate", {}, false};
  for (const auto& [name, series] : series_) {
    switch (panel_of(name)) {
      case Panel::loss: panels[0].series.push_back(series); break;
      case Panel::accuracy: panels[1].series.push_back(series); break;
      case Panel::learning_rate: panels[2].series.push_back(series); break;
      case Panel::none: break;
    }
  }
  return panels;
}

void TrainingCurves::write(const std::string& path) const { write_svg_panels(path, panels()); }

}  // namespace kiln
