package main

import (
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart geometry.
const (
	chartWidth  = 12 * vg.Inch
	chartHeight = 4.5 * vg.Inch
	chartTitle  = vg.Length(28) // room for the figure's title
)

// chart draws one panel per workload, each with its own scale (the limits
// differ by an order of magnitude): the median items/s of each method as a
// bar with min–max error bars, and the limit as a dashed line across the
// panel. path ends in .png or .svg.
func (t *throughputResult) chart(path, command string) error {
	var c interface {
		vg.CanvasSizer
		io.WriterTo
	}
	switch filepath.Ext(path) {
	case ".png":
		c = vgimg.PngCanvas{Canvas: vgimg.New(chartWidth, chartHeight)}
	case ".svg":
		c = vgsvg.New(chartWidth, chartHeight)
	default:
		return fmt.Errorf("%s: want .png or .svg", path)
	}
	dc := draw.New(c)
	row := make([]*plot.Plot, len(t.Workloads))
	for i, w := range t.Workloads {
		p, err := t.panel(w, i == 0)
		if err != nil {
			return err
		}
		row[i] = p
	}
	tiles := draw.Tiles{Rows: 1, Cols: len(row), PadX: 4 * vg.Millimeter, PadTop: chartTitle, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter}
	canvases := plot.Align([][]*plot.Plot{row}, tiles, dc)
	for i, p := range row {
		p.Draw(canvases[0][i])
	}
	title := draw.TextStyle{
		Color:   color.Black,
		Font:    font.From(plot.DefaultFont, 13),
		Handler: plot.DefaultTextHandler,
		XAlign:  draw.XCenter,
		YAlign:  draw.YTop,
	}
	dc.FillText(title, vg.Point{X: chartWidth / 2, Y: chartHeight - 6},
		fmt.Sprintf("%s: items/s, median and min–max of %d rounds of %s entries; dashed: the limit (redis-cli --pipe)", command, t.Rounds, commas(t.Items)))

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// panel is the plot of one workload: a bar per method but the limit, and
// the limit as a line.
func (t *throughputResult) panel(w throughputWorkload, first bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = w.Title
	if k := w.method(methodKeyswap); k != nil && k.Summary.Ratio != 0 {
		p.Title.Text += fmt.Sprintf("\nkeyswap / limit %.2f", k.Summary.Ratio)
	}
	if first {
		p.Y.Label.Text = "M items/s"
	}
	p.Y.Min = 0
	var names []string
	top := 0.0
	for k, m := range allMethods {
		s := w.method(m)
		if m == methodLimit || s == nil {
			continue
		}
		x := float64(len(names))
		names = append(names, string(m))
		med, lo, hi := s.Summary.Rate/1e6, s.Summary.RateMin/1e6, s.Summary.RateMax/1e6
		top = max(top, hi)
		bars, err := plotter.NewBarChart(plotter.Values{med}, vg.Points(28))
		if err != nil {
			return nil, err
		}
		bars.XMin = x
		bars.Color = plotutil.Color(k - 1)
		bars.LineStyle.Width = 0
		ebars, err := plotter.NewYErrorBars(struct {
			plotter.XYs
			plotter.YErrors
		}{plotter.XYs{{X: x, Y: med}}, plotter.YErrors{{Low: med - lo, High: hi - med}}})
		if err != nil {
			return nil, err
		}
		p.Add(bars, ebars)
	}
	if s := w.method(methodLimit); s != nil {
		limit := s.Summary.Rate / 1e6
		top = max(top, limit)
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: limit}, {X: float64(len(names)) - 0.5, Y: limit}})
		if err != nil {
			return nil, err
		}
		l.Color = color.Black
		l.Width = vg.Points(2)
		l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
		p.Add(l)
	}
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
	p.Y.Max = top * 1.1
	return p, nil
}
